"""One simulation: episodes of runs moved by workers, a sweep and an operator, under a seeded schedule.

An episode starts a few runs (one per flow the client starts, `_world.STARTED`, and the tool
loop; more when asked) on fresh storage, and the child runs the workers start join them
(`find_children`). Its actors are 2 to 4 workers, the ``recover_all`` sweep and an operator,
all on the real code: each worker is an `agentflow.celery.Worker` (the superstep logic of
the Celery tasks, without Celery) whose messages come from the simulated `Broker`; the sweep calls
`Worker.stranded` as the beat's ``recover_all`` does; the operator reads each run with the
audit read model and acts through the public operations (decide calls in doubt, approve,
retry, cancel). Faults land while the episode runs; then a drain phase without new faults
lets the operator and the sweep finish every run, and the end-of-episode invariants are
checked (`Episode.check_end`). Episodes follow each other until the step budget is spent.
What the operator does at each visit is `_operator.Operator`.

A failure stops the simulation: the `Failure` names the seed of the episode (replay it with
``make sim SEED=...``), the invariant and the last choices of the schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import traceback
import zlib
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentflow._errors import (
    AgentflowError,
    CheckpointError,
)
from agentflow._run_types import RunKind
from agentflow.celery import WorkerSettings
from agentflow.celery.follow_ups import FollowUp, after_child, after_superstep, after_sweep
from agentflow.celery.worker import Worker
from agentflow.exec import LoopRunner
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.records import ENDED, SealedCall, SealedCheckpoint
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer
from agentflow.models import Message as ChatMessage
from agentflow.sim._broker import HANDOFF_CAUSES, Broker, Message, MessageFaults
from agentflow.sim._clock import Clocks, SimLoop, VirtualClock, virtual_time
from agentflow.sim._deploys import first_code, maybe_deploy
from agentflow.sim._operator import KEY, Operator
from agentflow.sim._reach import Profile, Reach, before_write, between_read_and_write, draw
from agentflow.sim._scheduler import ACTOR, Choice, Parked, Scheduler, Stats
from agentflow.sim._setups import SetUp, Storage
from agentflow.sim._store import Points, StoreFault, sim_store
from agentflow.sim._world import LOOP, LOOP_STEPS, STARTED, Order, World, expected_states, make_app


@dataclass
class Faults:
    """How often each fault fires (per scheduling step, per store operation, per message)."""

    crash: float = 0.004
    stall: float = 0.004
    store_before: float = 0.004
    store_after: float = 0.004
    tamper: float = 0.001
    """Per step: someone writes behind the store's back (where the set-up models it, `Storage.tamper`)."""
    lost_writes: float = 0.0
    """Per step: the store fails over to a replica that lacks its latest acknowledged writes (where the
    set-up models it, `Storage.fail_over`). Off by default: on a store that does not wait for its replica
    a lost ``started`` lets a call run again; ``memory-waiting`` waits as ``wait_replicas=1`` does and
    survives it (docs/simulation.md)."""
    replicated: float = 0.1
    """Per step, with `lost_writes`: the replica catches up with every write acknowledged so far."""
    messages: MessageFaults = field(default_factory=lambda: MessageFaults(lost=0.03, doubled=0.05, late=0.05))
    deploy: float = 0.0005
    """Per step: the code is redeployed (`_deploys`: a tool's flags, a tool's name, a new flow version)."""


@dataclass
class Config:
    """What one simulation runs."""

    steps: int = 100_000
    """Scheduling steps in all (the budget; the last episode may end a little past it)."""
    runs: int = 4
    """Runs started per episode (the flows, then the tool loop, in turn)."""
    faults: Faults = field(default_factory=Faults)
    episode_steps: int = 6_000
    """Steps an episode runs with faults before its drain."""
    drain_steps: int = 30_000
    """Steps the drain may take to finish every run, else the episode fails as stuck."""
    settings: WorkerSettings = field(
        default_factory=lambda: WorkerSettings(lease_s=30.0, stale_after_s=10.0, recover_interval_s=60.0)
    )
    operator_every_s: float = 20.0
    cancel: float = 0.02
    """Chance that the operator cancels one running run at a visit."""
    fork: float = 0.01
    """Chance that the operator forks a flow run at a visit (`_operator.FORKS` at most an episode)."""
    migrate: float = 0.1
    """Chance that the operator moves a run of an older flow version onto the newest at a visit."""
    suppress: frozenset[int] = frozenset()
    """Faults (by their number in the episode, from 1) drawn but not applied: how a failure is shrunk."""
    reach: Reach | None = field(default_factory=Reach)
    """How each episode draws its fault rates, favoured points and length (`_reach`); None: as configured."""


@dataclass
class Failure:
    """A broken invariant: where, when, and the schedule that led there."""

    setup: str
    seed: int
    episode: int
    invariant: str
    schedule: list[Choice]
    runs: dict[str, str]
    faults: list[tuple[int, str, str]] = field(default_factory=list)
    """Every fault that fired in the episode: (number, kind, point)."""
    suppressed: frozenset[int] = frozenset()
    steps: int = 0
    rows: list[str] = field(default_factory=list)
    """The ledger's effects and the store's rows of every run, as they stood at the failure."""

    def __str__(self) -> str:
        lines = [
            f"invariant broken on {self.setup}, episode {self.episode}, seed {self.seed}, "
            f"after {self.steps} steps and {len(self.faults)} faults: {self.invariant}",
            f"replay: make sim SETUP={self.setup} SEED={self.seed}"
            + (f" SUPPRESS={_ids(self.suppressed)}" if self.suppressed else ""),
            "runs: " + ", ".join(f"{r}={s}" for r, s in sorted(self.runs.items())),
            *self.rows,
            f"the last {len(self.schedule)} choices:",
            *(str(c) for c in self.schedule),
        ]
        return "\n".join(lines)


@dataclass
class Report:
    """What a simulation did."""

    setup: str
    seed: int
    stats: Stats
    episodes: int = 0
    runs: int = 0
    ends: dict[str, int] = field(default_factory=dict)
    claims: Counter[str] = field(default_factory=Counter)
    """The claims the runs took, by cause (a wake by what it woke: a timer, an approval's deadline, a child)."""
    effects: int = 0
    seconds: float = 0.0
    failure: Failure | None = None


def _ids(numbers: frozenset[int]) -> str:
    return ",".join(str(n) for n in sorted(numbers))


def episode_seed(seed: int, episode: int) -> int:
    """The seed of one episode of a simulation (what a failure names, and ``SEED=`` replays)."""
    return zlib.crc32(f"{seed}/{episode}".encode())


class Episode(Points):
    """One episode's actors over one store set-up, under one scheduler (see the module docstring)."""

    def __init__(self, seed: int, storage: Storage, config: Config, clock: VirtualClock, loop: SimLoop) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.config = config
        # -- reach (`_reach`): this episode's fault rates, favoured points and length, drawn first
        self.profile: Profile | None = None
        if config.reach is not None:
            self.profile = draw(config.reach, config.faults, config.episode_steps, self.rng)
        self.faults = config.faults if self.profile is None else self.profile.faults
        self.episode_steps = config.episode_steps if self.profile is None else self.profile.steps
        self._stall_leases = (1.1, 2.5) if self.profile is None else self.profile.stall
        # -- end of reach
        self.clock = clock
        self.sched = Scheduler(self.rng, clock, loop)
        self.broker = Broker(random.Random(self.rng.random()), self.faults.messages)
        self.deploy_rng = random.Random(f"deploys/{seed}")
        """Deploys, forks and migrations draw here: an episode without them keeps the schedule it had."""
        self.world = World(sim=self)
        self.code = first_code(self.deploy_rng if self.faults.deploy else None)
        self.app = make_app(self.world, self.code)
        """The app deployed now (a worker keeps the one it started with: `_deploys`)."""
        self.storage = storage
        self.opener = storage.open
        self.opened: list[CheckpointStore] = []
        self.raw = self._open_raw()
        self.world.store, self.world.sealer = self.raw, Sealer(KEY)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.reported: set[str] = set()
        self.in_hand: dict[str, Message] = {}
        self.flows: dict[str, str] = {}
        self.workers = 0
        self.draining = False
        self.fired: list[tuple[int, str, str]] = []
        self._faults_drawn = 0
        self.steps = 0

    # -- what `SimPoints` and the tools ask ------------------------------------------------

    async def point(self, name: str, run_id: str | None = None) -> None:
        await self.sched.point(name, run_id=run_id)

    def store_fault(self, op: str) -> StoreFault | None:
        if self.draining or ACTOR.get() in ("operator", "client"):
            return None  # the operator's own mistakes are modelled by its decisions, not by its store
        roll = self.rng.random()
        if roll < self.faults.store_before and self.fires("store-fails-before", f"store.{op}"):
            return "before"
        if self.faults.store_before <= roll < self.faults.store_before + self.faults.store_after:
            if self.fires("store-fails-after", f"store.{op}"):
                return "after"
        return None

    def wrote(self, run_id: str, checkpoint: SealedCheckpoint | None, calls: Sequence[SealedCall]) -> None:
        for record in calls:
            self.world.wrote_call(run_id, record)
        if checkpoint is not None:
            self.world.wrote_checkpoint(run_id, checkpoint)

    def took(self, run_id: str) -> None:
        self.world.took(run_id)

    def fires(self, kind: str, point: str, actor: str | None = None) -> bool:
        """A fault was drawn: count it, and apply it unless the shrinker suppresses it."""
        self._faults_drawn += 1
        number = self._faults_drawn
        if number in self.config.suppress:
            self.sched.note(f"fault {number} ({kind} at {point}) suppressed")
            return False
        self.fired.append((number, kind, point))
        self.sched.stats.faults[kind] += 1
        self.sched.stats.covered.add((kind, point))
        self.sched.note(f"FAULT {number}: {kind} at {point}" + (f" ({actor})" if actor else ""))
        return True

    # -- stores ------------------------------------------------------------------------------

    def _open_raw(self) -> CheckpointStore:
        store = self.opener()
        self.opened.append(store)
        return store

    def _open(self) -> CheckpointStore:
        store = sim_store(self.opener(), self)
        self.opened.append(store)
        return store

    @staticmethod
    def loop_runner(worker: Worker) -> LoopRunner:
        """The simulated tool loop's runner in `worker`."""
        runner = worker.runs.loop(LOOP)
        assert isinstance(runner, LoopRunner)
        return runner

    def _worker(self, name: str) -> Worker:
        worker = Worker(self.app, self._open, KEY, self.config.settings)
        worker.node = name
        worker.send = self._send_from_thread  # a `Child` node's start, as the Celery tasks enqueue it
        return worker

    def _send_from_thread(self, flow: str, run_id: str, step: int, cause: str, *, version: str | None = None) -> str:
        """What `Worker.send` does in the simulation: the message goes to the broker, on the loop's thread.

        It is called on a thread (`QueuedChildren` enqueues as a Celery task publishes) while the
        task that called it waits and every other task is parked, so the send lands before that
        task goes on, in the same place of every replay.
        """
        self.sched.loop.call_soon_threadsafe(self.send, Message(flow, run_id, step, cause))
        return f"sim-{run_id}-{step}-{cause}"

    # -- actors ------------------------------------------------------------------------------

    def spawn(self, name: str, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start an actor: a task whose context (and every task it makes) carries its name."""
        token = ACTOR.set(name)
        try:
            self.tasks[name] = asyncio.get_running_loop().create_task(body(), name=name)
        finally:
            ACTOR.reset(token)

    def send(self, msg: Message, delay: float = 0.0) -> None:
        fires = (
            (lambda kind: False) if self.draining else (lambda kind: self.fires(f"message-{kind}", f"send.{msg.cause}"))
        )
        for what in self.broker.send(msg, self.clock.now, delay, fires):
            self.sched.note(f"broker: {what}")

    async def receive(self) -> Message:
        await self.sched.point("broker.receive", lambda: self.broker.deliverable(self.clock.now))
        return self.broker.take(self.clock.now)

    async def worker_actor(self) -> None:
        name = ACTOR.get()
        worker = self._worker(name)
        await self.recover_all(worker, startup=True)
        while True:
            msg = await self.receive()
            self.in_hand[name] = msg
            self.sched.note(f"{name}: takes {msg}")
            try:
                outcome = await worker.superstep(
                    msg.flow, msg.run_id, msg.step, handoff=msg.handoff, cause=msg.cause, again=msg.redelivered
                )
            except CheckpointError as exc:  # the store failed: the task fails, its message is acknowledged
                self.sched.note(f"{name}: {msg} failed: {exc}")
                continue
            finally:
                self.in_hand.pop(name, None)
            self.sched.note(f"{name}: {msg} -> {outcome.done} {outcome.status or ''} {outcome.step}")
            if outcome.done == "elsewhere":  # a run of a version this worker's code lacks: sent on (`_routing`)
                self.send(msg, 1.0)
            self.follow_up(after_superstep(outcome, msg.flow, msg.run_id, msg.step))
            try:
                self.follow_up(await after_child(worker, outcome))  # a child ended: its parent's wake
            except CheckpointError as exc:  # the store failed reading the parent: the sweep wakes it later
                self.sched.note(f"{name}: the wake of {outcome.parent} failed: {exc}")

    def follow_up(self, sent: list[FollowUp]) -> None:
        """Send what the Celery task would send next (`agentflow.celery.follow_ups`: the one rule)."""
        for up in sent:
            delay = up.countdown(self.clock.time(), self.config.settings.recheck_margin_s)
            self.send(Message(up.flow, up.run_id, up.step, up.cause), delay or 0.0)

    async def recover_all(self, worker: Worker, *, startup: bool) -> None:
        """What the ``recover_all`` task does: send what `Worker.stranded` found, then mark it."""
        try:
            found = await worker.stranded(startup=startup)
            if found is None:
                return
            self.follow_up(after_sweep(found))
            await worker.mark_recoveries(found)
        except CheckpointError as exc:
            self.sched.note(f"{ACTOR.get()}: recover_all failed: {exc}")

    async def sweep_actor(self) -> None:
        worker = self._worker("sweep")
        interval = self.config.settings.recover_interval_s or 60.0
        while True:
            await asyncio.sleep(interval)
            if worker.flow_app is not self.app:  # the beat's worker was redeployed
                worker = self._worker("sweep")
            await self.recover_all(worker, startup=False)

    async def client_actor(self) -> None:
        worker = self._worker("client")
        names = [*STARTED, RunKind.LOOP.column(LOOP)]
        for i in range(self.config.runs):
            flow = names[i % len(names)]
            run_id = f"r{i}-{flow.replace(':', '-')}"
            self.flows[run_id] = flow
            if RunKind.of(flow) is RunKind.LOOP:
                opening = [ChatMessage(role="user", content=run_id)]
                await self.loop_runner(worker).start(opening, run_id=run_id, max_steps=LOOP_STEPS)
            else:
                await worker.runner.start(self.app.flows[flow], Order(order=run_id), run_id=run_id)
            self.send(Message(flow, run_id, 0, "start"))

    async def operator_actor(self) -> None:
        operator = Operator(self, self._worker("operator"))
        while True:
            await asyncio.sleep(self.config.operator_every_s)
            if operator.worker.flow_app is not self.app:  # the console runs the code deployed now
                operator.worker = self._worker("operator")
            await self.find_children()
            for run_id, flow in sorted(self.flows.items()):
                await operator.visit(run_id, flow)

    # -- the schedule --------------------------------------------------------------------------

    def choose_fault(self) -> bool:
        """Maybe crash or stall a worker that is parked at a point; return whether one fired."""
        if self.draining:
            return False
        roll = self.rng.random()
        if roll >= self.faults.crash + self.faults.stall:
            return False
        victims = sorted({p.actor for p in self.sched.runnable() if p.actor.startswith("worker")})
        if not victims:
            return False
        actor = self.rng.choice(victims)
        point = next(p.point for p in self.sched.parked if p.actor == actor)
        return self._strike(actor, point, crash=roll < self.faults.crash)

    def _strike(self, actor: str, point: str, *, crash: bool, leases: tuple[float, float] | None = None) -> bool:
        """Crash or stall `actor` at `point` (for `leases`, else the episode's stalls); whether it fired."""
        again, until = (
            self.rng.random() < 0.5,
            self.clock.now + self.config.settings.lease_s * self.rng.uniform(*(leases or self._stall_leases)),
        )
        if crash:
            if not self.fires("crash", point, actor):
                return False
            self.kill(actor, again)
        else:
            if not self.fires("stall", point, actor):
                return False
            self.sched.stall(actor, until)
            held = self.in_hand.get(actor)
            if held is not None and until - self.clock.now > self.config.settings.lease_s:
                self._echo(held)  # its lease lapses while it stands still: a twin of its message may come
        return True

    def kill(self, actor: str, again: bool) -> None:
        """A worker dies where it is parked (its message comes back `again`, or never); the pool starts a new one.

        The new worker runs the code deployed now (`_deploys`).
        """
        self.sched.crash(actor)
        held = self.in_hand.pop(actor, None)
        if held is not None and again:
            self.broker.redeliver(held, self.clock.now)
        if held is not None:
            self._echo(held)
        self.workers += 1
        self.spawn(f"worker{self.workers}", self.worker_actor)  # the pool starts a new process

    def _echo(self, held: Message) -> None:
        """Reach: a crashed or long-stalled worker's message comes back unflagged, its lease lapsed (`Profile.echo`)."""
        profile = self.profile
        if profile is None or not profile.echo or held.cause not in HANDOFF_CAUSES:
            return
        roll, after = self.rng.random(), self.rng.uniform(*profile.echo_after)
        if roll < profile.echo and self.fires("message-doubled", f"crash.{held.cause}"):
            due = self.clock.now + self.config.settings.lease_s * after
            self.broker.echo(held, due)
            self.sched.note(f"broker: echo of {held} due at {due:.3f}")

    async def maybe_tamper(self) -> None:
        """Now and then someone writes to the storage behind the store's back (where the set-up can)."""
        if self.draining or self.storage.tamper is None or not self.flows:
            return
        if self.rng.random() >= self.faults.tamper:
            return
        run_id = self.rng.choice(sorted(self.flows))
        if self.fires("tamper", "between-steps"):
            did = await self.storage.tamper(run_id)
            self.sched.note(f"tamper: {did or 'nothing to set back'}")

    def maybe_fail_over(self) -> None:
        """Now and then the store's replica catches up; more rarely the primary is lost and the replica takes over."""
        storage = self.storage
        if self.draining or not self.faults.lost_writes or storage.replicate is None or storage.fail_over is None:
            return
        caught_up, lost = self.rng.random(), self.rng.random()
        if caught_up < self.faults.replicated:
            storage.replicate()
        elif lost < self.faults.lost_writes and self.fires("lost-writes", "between-steps"):
            self.world.lost_writes = True
            self.sched.note(f"failover: {storage.fail_over()}")

    def step(self) -> bool:
        """Make one choice; return False when nothing can happen any more."""
        sched = self.sched
        sched.stats.steps += 1
        if self.choose_fault():
            return True
        runnable = sched.runnable()
        if runnable and self.rng.random() > 0.03:
            chosen = self.rng.choice(runnable)
            if self._favoured(chosen.actor, chosen.point):  # reach: a fault where a stale read is acted on
                return True
            chosen = self._cut_short(chosen)  # reach: a stalled worker's write lands first
            sched.note(f"{chosen.actor}: {chosen.point}")
            sched.resume(chosen)
            return True
        when = sched.next_event(self.broker.next_due(self.clock.now))
        if when is None:
            return bool(runnable)
        sched.advance_to(when)
        sched.note(f"clock -> {when:.3f}")
        return True

    def _favoured(self, actor: str, point: str) -> bool:
        """A worker about to go on from a point between a read and its write: fault it there (`Profile.hot`)."""
        profile = self.profile
        if profile is None or self.draining or not actor.startswith("worker"):
            return False
        if point.startswith("tool.") and profile.tool_crash and self.rng.random() < profile.tool_crash:
            return self._strike(actor, point, crash=True)  # a call left in doubt: started, maybe had its effect
        if not profile.hot or not between_read_and_write(point) or self.rng.random() >= profile.hot:
            return False
        # A stall right before a write outlasts the worker's lease: its write comes late (`Profile.long`)
        leases = profile.long if before_write(point) else None
        return self._strike(actor, point, crash=self.rng.random() < profile.hot_crash, leases=leases)

    def _cut_short(self, chosen: Parked) -> Parked:
        """`chosen` is about to write a run's rows: a worker stalled before a write of that run's may go first.

        Its stall lasted exactly until here (`Profile.cut`): the late write lands between
        `chosen`'s read of the run and the write that read justifies.
        """
        profile, sched = self.profile, self.sched
        if profile is None or self.draining or not profile.cut or chosen.run_id is None:
            return chosen
        if not chosen.actor.startswith("worker") or self.rng.random() >= profile.cut:
            return chosen
        stalled = [p for p in sched.parked if p.actor in sched.stalled and p.run_id == chosen.run_id]
        if not stalled:
            return chosen
        woken = self.rng.choice(stalled)
        sched.wake(woken.actor)
        sched.note(f"{woken.actor}: its stall ends right before {chosen.actor}'s {chosen.point}")
        return woken

    async def rows(self) -> list[str]:
        """The ledger and each run's rows (checkpoints and call records, as the world decodes them)."""
        lines = ["ledger:"]
        lines += [f"  t={e.at:9.3f} {e.actor}: {e.tool} {e.call_id} of {e.run_id}" for e in self.world.effects]
        for run_id in sorted(self.flows):
            lines.append(f"rows of {run_id}:")
            with contextlib.suppress(AgentflowError):
                for row in await self.raw.history(run_id):
                    body = json.loads(row.payload)
                    claim = f" claim={body['claim']}" if "claim" in body else ""
                    rerun = f" rerun={body['rerun']}" if body.get("rerun") else ""
                    lines.append(
                        f"  checkpoint {row.step} {row.status} segment {row.segment}{claim}{rerun} by {body.get('by')}"
                    )
                for rec in await self.raw.calls(run_id):
                    lines.append(f"  call {rec.segment}.{rec.seq} {rec.kind} {json.loads(rec.payload).get('call_id')}")
        return lines

    async def find_children(self) -> None:
        """Add the runs the workers started as children to the runs of the episode (read without points).

        The operator looks after them as after every run (their calls in doubt too), and every
        one of them must end like the runs the client started.
        """
        for run_id in await self.raw.stored_runs():
            if run_id not in self.flows:
                with contextlib.suppress(AgentflowError):
                    self.flows[run_id] = (await self.raw.latest(run_id)).flow

    async def ended(self) -> dict[str, str]:
        """Each run's latest status, read without points (the children found so far among them)."""
        await self.find_children()
        statuses = {}
        for run_id in self.flows:
            try:
                statuses[run_id] = (await self.raw.latest(run_id)).status
            except AgentflowError:
                statuses[run_id] = "missing"
        return statuses

    async def claims(self) -> Counter[str]:
        """The claims the episode's runs took, by cause (a wake by what it woke: ``wake:timer``, ``wake:child``...)."""
        counted: Counter[str] = Counter()
        for run_id in self.flows:
            with contextlib.suppress(AgentflowError):
                bodies = [json.loads(row.payload) for row in await self.raw.history(run_id)]
                for before, body in zip([{}, *bodies], bodies, strict=False):
                    counted.update(["fork"] if "forked_from" in body else [])
                    if "claim" in body:
                        woke = (before.get("wake") or {}).get("for") if body["claim"] == "wake" else None
                        counted[f"wake:{woke}" if woke else str(body["claim"])] += 1
        return counted

    async def run(self) -> int:
        """Run the episode to its end; return its steps. Raises `EpisodeFailed` on a broken invariant."""
        self.spawn("client", self.client_actor)
        for _ in range(self.rng.randint(2, 4)):
            self.workers += 1
            self.spawn(f"worker{self.workers}", self.worker_actor)
        self.spawn("sweep", self.sweep_actor)
        self.spawn("operator", self.operator_actor)
        try:
            try:
                await self._run_steps()
                await self.check_end()
                if self.world.violations:
                    raise EpisodeFailed(self.world.violations[0], await self.ended())
            except EpisodeFailed as exc:
                exc.rows = await self.rows()
                raise
            return self.steps
        finally:
            await self.teardown()

    async def _run_steps(self) -> None:
        """Step until every run ended; raise `EpisodeFailed` when an invariant breaks or the runs never end."""
        while True:
            await self.sched.settle()
            self._check_actors()
            if self.world.violations:
                raise EpisodeFailed(self.world.violations[0], await self.ended())
            if self.steps >= self.episode_steps and not self.draining:
                self.draining = True
                self.sched.note("drain: no new faults; the operator and the sweep finish the runs")
                self.sched.stalled.clear()
            if self.flows and self.steps % 50 == 0 and self.client_done():
                statuses = await self.ended()
                if all(s in ENDED or run_id in self.world.reported for run_id, s in statuses.items()):
                    return
            await self.maybe_tamper()
            self.maybe_fail_over()
            maybe_deploy(self)
            if self.steps >= self.episode_steps + self.config.drain_steps or not self.step():
                statuses = await self.ended()
                raise EpisodeFailed(f"runs did not end (stuck or lost): {statuses}", statuses)
            self.steps += 1

    def client_done(self) -> bool:
        task = self.tasks.get("client")
        return task is not None and task.done()

    def _check_actors(self) -> None:
        """An actor that died of an exception is a bug in the code under test (or in the simulation).

        One that died of a `BaseException` that is no `Exception` was stopped from outside (a
        test's time limit, Ctrl-C): that is raised again, not reported as a broken invariant.
        """
        for name, task in self.tasks.items():
            if name not in self.reported and task.done() and not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                if exc is not None and not isinstance(exc, Exception):
                    raise exc
                where = traceback.extract_tb(exc.__traceback__)[-4:] if exc is not None else []
                at = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(where))
                self.world.violations.append(f"actor {name} raised {type(exc).__name__}: {exc} (at {at})")
                self.reported.add(name)

    async def check_end(self) -> None:
        """The end-of-episode invariants: every run ended, done ones as without faults, verify clean."""
        expected = expected_states(self.flows, self.world.forks)
        for run_id in self.flows:
            report = await read_run(self.raw, Sealer(KEY), run_id)
            if report.problems:
                self.world.verify_reports(run_id, report.problems)
            if report.problems and run_id in self.world.reported:
                continue  # its state is not shown while verify finds problems; reporting them is what is owed
            if report.status == "done" and run_id in expected and report.state != expected[run_id]:
                self.world.violations.append(f"{run_id} ended done with {report.state}, not {expected[run_id]}")

    async def teardown(self) -> None:
        self.sched.drop_all()
        # Library code may hold a cancellation back (a shielded read it waits for) and then
        # sleep: cancel again, and move the clock to the next timer, until every actor is gone.
        for _ in range(50):
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
            if not pending:
                break
            for task in pending:
                task.cancel()
            await self.sched.settle()
            when = self.sched.loop.next_timer()
            if when is not None:
                self.sched.advance_to(self.clock.since_start(when))
        for store in self.opened:
            with contextlib.suppress(Exception):
                await store.aclose()


class EpisodeFailed(Exception):
    """An invariant broke in an episode."""

    def __init__(self, invariant: str, runs: dict[str, str]) -> None:
        super().__init__(invariant)
        self.invariant = invariant
        self.runs = runs
        self.rows: list[str] = []


def run_simulation(
    setup: SetUp, seed: int, config: Config, *, only_episode: int | None = None, until: float | None = None
) -> Report:
    """Run episodes on `setup` until `config.steps` are spent (or the one episode of seed `only_episode`).

    `until` (a ``time.perf_counter()`` instant) stops it after the episode under way then: a
    wall-clock limit for hunts on a shared machine (`agentflow.sim.mutants`).

    Each episode runs on a new event loop and a new virtual clock, so it depends on its
    seed alone: the seed a failure names replays it exactly.
    """
    import time as wall

    clocks = Clocks()
    report = Report(setup.name, seed, Stats())
    began = wall.perf_counter()
    try:
        with virtual_time(clocks):
            episode = 0
            while report.stats.steps < config.steps and (until is None or wall.perf_counter() < until):
                this = only_episode if only_episode is not None else episode_seed(seed, episode)
                clocks.current = VirtualClock()
                loop = SimLoop(clocks.current)
                try:
                    ep = Episode(this, setup.episode(f"e{episode}-{this}"), config, clocks.current, loop)
                    try:
                        loop.run_until_complete(ep.run())
                    except EpisodeFailed as exc:
                        report.failure = Failure(
                            setup.name, this, episode, exc.invariant, ep.sched.log[-ep.sched.keep_log :], exc.runs,
                            ep.fired, config.suppress, ep.steps, exc.rows,
                        )  # fmt: skip
                        break
                    finally:
                        _merge(report.stats, ep.sched.stats)
                        report.effects += len(ep.world.effects)
                    report.episodes += 1
                    report.runs += len(ep.flows)
                    for status in loop.run_until_complete(_statuses(ep)).values():
                        report.ends[status] = report.ends.get(status, 0) + 1
                    report.claims.update(loop.run_until_complete(ep.claims()))
                finally:
                    loop.close()
                episode += 1
                if only_episode is not None:
                    break
    finally:
        setup.cleanup()
    report.seconds = wall.perf_counter() - began
    return report


async def _statuses(ep: Episode) -> dict[str, str]:
    return await ep.ended()


def _merge(total: Stats, one: Stats) -> None:
    total.steps += one.steps
    total.faults.update(one.faults)
    total.covered |= one.covered
    total.points |= one.points


__all__ = ["Config", "Failure", "Faults", "Report", "run_simulation"]
