"""Run ownership between real processes (issue 14), on every store set-up another process can open.

- A live run is never taken over: while a worker process sits inside a call that is not
  idempotent (its ``started`` logged, its effect not yet had) and renews its lease, every
  entry point of this process (recover, with and without rerun_in_doubt, recover_all,
  resume, advance, decide_in_doubt), the CLI (``agentflow recover``, ``resume``, ``runs
  show``) and the viewer's Approve are refused naming the worker, and nothing is written;
  once the worker goes on, the call ran once and the run is done.
- A frozen worker is taken over and fenced: a worker process stopped (SIGSTOP) inside a call
  loses its lease; this process takes the run over (a claim opens a new segment) and moves
  it a superstep on; woken (SIGCONT), the worker's next ``started`` record is refused (a node
  with a call after the frozen one) or its save conflicts (the frozen call was its
  superstep's only one), no effect of it follows, and the run then finishes here, checking.
  A worker frozen between a call's ``started`` and its tool (its approval port deciding) is
  taken over the same way; woken, it confirms its lease before the tool, finds it gone, and
  runs nothing (`LeaseLost`), though the run had rerun the call meanwhile.
- Takers racing for a lapsed lease: a worker process killed (SIGKILL) inside a call leaves
  its lease to lapse; three racer processes then take it at the same instant through the
  store's own lease, and exactly one of them recovers the run.

The worker processes are tests/protocol/ownership_worker.py (its docstring says what they
print), each forked from its warm server (`_kit.forkpopen`): a real process, stopped and killed
as one. The CLI runs in this process (click's runner, on a thread: it starts its own event
loop), and the viewer through Starlette's test client, on every set-up: each takes a fraction
of a second. Every wait polls with a deadline; every process started is killed afterwards
(continued first if it was stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import ownership_worker
import pytest
from _kit import forkpopen
from _kit.faults import FaultyStore, body, node_of
from _kit.poll import until
from _kit.specs import open_spec
from _kit.tickets import BATCH, KEY, LOOKUP, ORDER, REFUNDS, TICKETS, Ledger, Refund, make_tickets
from click.testing import CliRunner, Result
from starlette.testclient import TestClient

from agentflow import Executor, FlowRunner
from agentflow.cli._group import cli
from agentflow.errors import RecoveryNeedsDecision, RunHeld
from agentflow.exec.checkpoints import CheckpointStore, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.records import Lease
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer
from agentflow.viewer import ViewerSettings, create_app

#: Worker processes started, frozen or killed: seconds each (make check leaves them to make test).
pytestmark = pytest.mark.slow

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
#: The workers' leases: short, so that renewals (every third) happen many times while a test acts.
LEASE_S = 1.0
#: The longest any awaited event may take.
DEADLINE_S = 30.0
#: The app the CLI and the viewer act with.
APP = "ownership_worker:app"
#: This process, as it names itself in leases and decisions.
TESTER = "tester@test-process:1"
SEALER = Sealer(KEY)


# -- worker processes -------------------------------------------------------------------------


class Worker:
    """One ownership_worker.py process: its JSON events on stdout, its stderr in a file."""

    def __init__(self, args: Sequence[str], log: Path) -> None:
        self.log = log
        self.proc = forkpopen.spawn(HERE / "ownership_worker.py", list(args), stderr=log)
        self.out: IO[str] = self.proc.stdout
        self.stopped = False
        self._backlog: list[dict[str, Any]] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.proc.stderr_text()

    async def next(self, event: str, timeout_s: float = DEADLINE_S, **match: Any) -> dict[str, Any]:
        """The next event called `event` (whose fields include `match`), read within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            for found in self._backlog:
                if found["event"] == event and match.items() <= found.items():
                    self._backlog.remove(found)
                    return found
            left = deadline - time.monotonic()
            try:
                line = await asyncio.wait_for(asyncio.to_thread(self.out.readline), max(left, 0.001))
            except TimeoutError:
                raise AssertionError(f"no {event!r} event within {timeout_s} s; stderr:\n{self.stderr()}") from None
            if not line:
                self.proc.wait(5)
                raise AssertionError(  # what it said last (its "end" names the outcome) and its log
                    f"the worker exited ({self.proc.returncode}) before {event!r}; it said {self._backlog}:\n"
                    f"{self.stderr()}"
                )
            self._backlog.append(json.loads(line))

    def freeze(self) -> None:
        """SIGSTOP, and wait until the kernel shows the process stopped."""
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True
        stat = Path(f"/proc/{self.pid}/stat")
        deadline = time.monotonic() + DEADLINE_S
        # The state is the field after the parenthesised command name.
        while stat.read_text().rpartition(")")[2].split()[0] != "T":
            assert time.monotonic() < deadline, "the worker did not stop"
            time.sleep(0.005)

    def wake(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False

    def kill(self) -> None:
        """SIGKILL (continued first if stopped), reaped; pipes closed."""
        if self.proc.poll() is None:
            if self.stopped:
                self.wake()
            self.proc.kill()
        self.proc.wait(10)
        self.proc.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start ownership_worker.py processes; every one is killed when the test ends, however it ends."""
    started: list[Worker] = []

    def start(*args: str) -> Worker:
        worker = Worker(args, tmp_path / f"worker-{len(started)}.stderr")
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()


def worker_args(mode: str, spec: str, tmp_path: Path, *more: str) -> list[str]:
    ledger, gate = tmp_path / "ledger.jsonl", tmp_path / "gate"
    return [mode, "--spec", spec, "--ledger", str(ledger), "--gate", str(gate), "--lease-s", str(LEASE_S), *more]


# -- polling ----------------------------------------------------------------------------------


async def renewed(store: CheckpointStore, run_id: str, after: Lease) -> Lease:
    """Wait until the holder of `after` renewed it: the same token, a later expiry."""

    async def check() -> Lease | None:
        lease = (await store.leases([run_id])).get(run_id)
        assert lease is not None and lease.token == after.token, f"{run_id}: the holder lost its lease: {lease}"
        return lease if lease.expires_at > after.expires_at else None

    return await until(check, f"a renewal of {run_id}'s lease", timeout_s=DEADLINE_S, every=0.01)


async def lapsed(store: CheckpointStore, run_ids: list[str]) -> None:
    async def check() -> bool | None:
        return True if not await store.leases(run_ids) else None

    await until(check, f"the leases of {run_ids} to lapse", timeout_s=DEADLINE_S, every=0.01)


async def frozen_past_its_lease(store: CheckpointStore, run_id: str, worker: Worker, blocked: dict[str, Any]) -> None:
    """Freeze (SIGSTOP) the blocked `worker` right after a renewal of its lease, and wait until that lease lapsed."""
    lease = (await store.leases([run_id]))[run_id]
    assert lease.owner == blocked["owner"]
    await renewed(store, run_id, lease)
    worker.freeze()
    await lapsed(store, [run_id])


async def rows(store: CheckpointStore, run_id: str) -> tuple[list[SealedCheckpoint], list[SealedCall]]:
    return list(await store.history(run_id)), list(await store.calls(run_id))


async def consistent(store: CheckpointStore, run_id: str) -> None:
    """The run checks as ``agentflow verify`` checks it: no problem, done, held by nobody."""
    report = await read_run(store, SEALER, run_id)
    assert report.problems == [], report.problems
    assert report.status == "done" and report.lease is None


@contextlib.asynccontextmanager
async def opened(spec: str) -> AsyncIterator[CheckpointStore]:
    store = open_spec(spec)
    try:
        yield store
    finally:
        await store.aclose()


def runner_here(store: CheckpointStore, ledger: Ledger) -> FlowRunner:
    """This process's runner, on the ticket tools (effects in the shared ledger file)."""
    return FlowRunner(Executor(make_tickets(ledger).registry), checkpoints=store, checkpoint_key=KEY, owner=TESTER)


# -- the CLI and the viewer -------------------------------------------------------------------


def cli_url(spec: str) -> str:
    """The ``--store`` URL of a spec (`_kit.specs.open_spec`)."""
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        return f"sqlite:///{rest}"  # an absolute path: sqlite:////tmp/...
    url, _, prefix = rest.rpartition("#")
    return f"{url}?prefix={prefix}" if kind == "redis" else f"{url}?table_prefix={prefix}"


async def agentflow(spec: str, *args: str) -> Result:
    """Run the ``agentflow`` command in this process, on a thread (it runs its own event loop)."""
    env: dict[str, str | None] = {"AGENTFLOW_CHECKPOINT_KEYS": "hex:" + KEY.hex(), "AGENTFLOW_ALLOW_DEMO_KEY": None}
    command = [*args, "--store", cli_url(spec)]
    return await asyncio.to_thread(CliRunner().invoke, cli, command, env=env, catch_exceptions=False)


class Viewer:
    """The viewer over a store of the set-up, through Starlette's test client (called on a thread)."""

    def __init__(self, spec: str) -> None:
        settings = ViewerSettings(open_spec(spec), [KEY], flows=ownership_worker.app, label="test store")
        self.client = TestClient(
            create_app(settings), client=("127.0.0.1", 50000), base_url="http://127.0.0.1", follow_redirects=False
        )

    async def __aenter__(self) -> Viewer:
        await asyncio.to_thread(self.client.__enter__)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.client.__exit__, None, None, None)  # its lifespan closes the store

    async def page(self, run_id: str) -> str:
        answer = await asyncio.to_thread(self.client.get, f"/runs/{run_id}")
        assert answer.status_code == 200, answer.text
        return answer.text

    async def approve(self, run_id: str, csrf: str) -> tuple[int, str]:
        form = {"csrf": csrf, "decision": "approve"}
        answer = await asyncio.to_thread(self.client.post, f"/runs/{run_id}/resume", data=form)
        return answer.status_code, answer.text


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert found, "the page offers no decision"
    return found.group(1)


# -- 1. a live run is never taken over --------------------------------------------------------


async def test_a_live_run_is_never_taken_over(shared_spec, tmp_path, spawn, monkeypatch):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    monkeypatch.setenv(ownership_worker.LEDGER_ENV, str(ledger.path))  # the CLI's and viewer's effects, if any
    async with opened(shared_spec) as raw, Viewer(shared_spec) as viewer:
        # Given refund-1, paused for approval, whose Approve form the viewer offered while it was free
        paused = await runner_here(raw, ledger).run(REFUNDS, Refund(amount=500), run_id="refund-1")
        assert paused.status == "paused"
        csrf = csrf_of(await viewer.page("refund-1"))
        # And a worker process inside charge_card of order-1 (not idempotent: started, no effect yet),
        # also holding refund-1 as a worker holds a run it moves; its leases last 1 s unless renewed
        worker = spawn(
            *worker_args("run", shared_spec, tmp_path, "--job", "tickets:order-1:charge_card"), "--hold", "refund-1"
        )
        owner = (await worker.next("blocked", run_id="order-1"))["owner"]
        assert (await worker.next("held", run_id="refund-1"))["owner"] == owner
        *_, last = await raw.calls("order-1")
        assert (last.kind, node_of(last)) == ("started", "pay")
        assert ledger.counts("order-1") == {"hold_seats": 1}
        # And both leases are the worker's, and it renews them
        held = await raw.leases(["order-1", "refund-1"])
        assert {run_id: lease.owner for run_id, lease in held.items()} == {"order-1": owner, "refund-1": owner}
        seen = {run_id: await renewed(raw, run_id, lease) for run_id, lease in held.items()}
        before = {run_id: await rows(raw, run_id) for run_id in ("order-1", "refund-1")}

        # When this process tries every entry point on them
        store = FaultyStore(open_spec(shared_spec))
        runner = runner_here(store, ledger)
        attempts: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("recover", lambda: runner.recover(TICKETS, "order-1")),
            ("recover, rerun_in_doubt", lambda: runner.recover(TICKETS, "order-1", rerun_in_doubt=True)),
            ("resume", lambda: runner.resume(TICKETS, "order-1", approve=True)),
            ("advance", lambda: runner.advance(TICKETS, "order-1", rerun_in_doubt=True)),
            ("decide_in_doubt", lambda: runner.decide_in_doubt(TICKETS, "order-1", operator="alice")),
            ("resume the paused run", lambda: runner.resume(REFUNDS, "refund-1", approve=True, operator="alice")),
        ]
        try:
            for name, attempt in attempts:
                with pytest.raises(RunHeld) as refused:
                    await attempt()
                # Then each is refused with RunHeld, naming the worker
                assert refused.value.owner == owner, name
                assert f"is held by {owner} until " in str(refused.value), name
            for rerun in (False, True):
                outcomes = await runner.recover_all(TICKETS, rerun_in_doubt=rerun)
                assert list(outcomes) == ["order-1"]
                assert isinstance(outcomes["order-1"], RunHeld) and outcomes["order-1"].owner == owner
            assert store.writes == [] and store.refused == []
        finally:
            await store.aclose()

        # And the command line leaves the run alone, saying who holds it
        for flags in (["--rerun-in-doubt"], []):
            recovered = await agentflow(shared_spec, "recover", "order-1", "--app", APP, *flags, "--as", "alice")
            assert recovered.exit_code == 0, recovered.output
            assert f"held by {owner} until " in recovered.stdout
            assert "1 run(s) are live on their workers and were left alone" in recovered.stdout
        for run_id in ("order-1", "refund-1"):
            resumed = await agentflow(shared_spec, "resume", run_id, "--app", APP, "--approve", "--as", "alice")
            assert resumed.exit_code == 2, resumed.output
            assert f"agentflow: run '{run_id}' is held by {owner} until " in resumed.stderr
        shown = await agentflow(shared_spec, "runs", "show", "order-1")
        assert f"running on {owner} until " in shown.stdout and "not in doubt" in shown.stdout

        # And the viewer offers no decision on the held paused run (Cancel asks the holder to stop; Fork reads only),
        # and refuses the Approve posted from before
        page = await viewer.page("refund-1")
        assert 'value="approve"' not in page and f"is held by {owner} until" in page
        assert 'name="reason"' in page  # the Cancel form
        status, answer = await viewer.approve("refund-1", csrf)
        assert status == 409 and "The run is held by a live worker" in answer
        assert f"run &#39;refund-1&#39; is held by {owner} until" in answer

        # And nothing was written, nothing ran, and the worker kept renewing its leases throughout
        assert {run_id: await rows(raw, run_id) for run_id in before} == before
        assert ledger.counts() == {"hold_seats": 1}
        for run_id, lease in seen.items():
            await renewed(raw, run_id, lease)

        # When the gate opens
        (tmp_path / "gate").touch()
        end = await worker.next("end")
        # Then the worker finishes order-1, charging once, and lets refund-1 go
        finished = end["jobs"]["order-1"]
        assert (finished["outcome"], finished["refused"]) == ("done", []), finished
        assert finished["ran"] == ["hold_seats", "charge_card", "email_tickets"]
        assert end["jobs"]["refund-1"] == {"outcome": "released"}
        assert ledger.counts("order-1") == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
        await consistent(raw, "order-1")
        # and refund-1, free now, is resumed here as it could not be before
        assert (await runner_here(raw, ledger).resume(REFUNDS, "refund-1", approve=True)).status == "done"
        assert ledger.counts("refund-1") == {"refund": 1, "notify": 1}
        assert ledger.repeated() == {}


# -- 2. a frozen worker is taken over and fenced -------------------------------------------------


async def test_a_frozen_worker_is_taken_over_and_fenced(shared_spec, tmp_path, spawn):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    # Given two worker processes inside slow_lookup (idempotent; started logged, effect had), leases of 1 s:
    # in batch-1 charge_card comes next in the same node; in lookup-1 slow_lookup is its superstep's only call
    jobs = {"batch-1": "batch:batch-1:slow_lookup", "lookup-1": "lookup:lookup-1:slow_lookup"}
    workers = {run_id: spawn(*worker_args("run", shared_spec, tmp_path, "--job", job)) for run_id, job in jobs.items()}
    blocked = {run_id: await worker.next("blocked") for run_id, worker in workers.items()}
    async with opened(shared_spec) as raw:
        # When each is frozen (SIGSTOP) right after a renewal (so no store operation of it is half done)
        for run_id, worker in workers.items():
            lease = (await raw.leases([run_id]))[run_id]
            assert lease.owner == blocked[run_id]["owner"]
            await renewed(raw, run_id, lease)
            worker.freeze()
        # And their leases lapse
        await lapsed(raw, list(jobs))
        # And this process takes both runs over and moves each one superstep on (a recovery claim opens
        # segment 1; the lookup in doubt is idempotent, so it reruns): the runs are still running, held by nobody
        runner = runner_here(raw, ledger)
        flows = {"batch-1": BATCH, "lookup-1": LOOKUP}
        for run_id, flow in flows.items():
            assert (await runner.advance(flow, run_id)).status == "running"
        taken = {run_id: await rows(raw, run_id) for run_id in jobs}
        for history, _ in taken.values():
            assert history[-1].segment == 1 and body(history[1])["claim"] == "recovery"
        effects = ledger.entries()

        # When the workers wake up (SIGCONT) and go on
        (tmp_path / "gate").touch()
        for worker in workers.values():
            worker.wake()
        ends = {run_id: (await worker.next("end"))["jobs"][run_id] for run_id, worker in workers.items()}

        # Then in batch-1 the worker's next started record (charge_card) was refused by the segment fencing
        batch = ends["batch-1"]
        assert (batch["outcome"], batch["error"]) == ("refused", "CheckpointConflict"), batch
        assert batch["refused"] == ["record_call:started"]
        assert "segment 0 was fenced off by segment 1" in batch["message"]
        # and in lookup-1 its save of the superstep was refused by the compare-and-set
        lookup = ends["lookup-1"]
        assert (lookup["outcome"], lookup["error"]) == ("refused", "CheckpointConflict"), lookup
        assert lookup["refused"] == ["save"], lookup
        # And neither had an effect after it woke, nor saved anything
        assert ledger.entries() == effects
        for run_id, end in ends.items():
            assert end["ran"] == blocked[run_id]["ran"], (run_id, end)
            assert [w for w in end["writes"] if w.startswith("save:")] == ["save:0:running"], (run_id, end)
            # its one write after it woke: the result of the call it had begun, logged late in its own old
            # segment (the store takes that: only a started record is fenced)
            history, calls = await rows(raw, run_id)
            assert history == taken[run_id][0]
            late = [c for c in calls if c not in taken[run_id][1]]
            assert [(c.segment, c.kind, body(c)["call_id"].split("/")[1]) for c in late] == [
                (0, "done", "batch" if run_id == "batch-1" else "look")
            ], late
            assert [c for c in calls if c not in late] == taken[run_id][1]

        # When this process finishes both runs
        for run_id, flow in flows.items():
            assert (await runner.recover(flow, run_id)).status == "done"
        # Then each effect that is not idempotent happened once, and both stored runs check
        assert ledger.counts("batch-1") == {"hold_seats": 1, "slow_lookup": 2, "charge_card": 1, "email_tickets": 1}
        assert ledger.counts("lookup-1") == {"slow_lookup": 2, "charge_card": 1, "email_tickets": 1}
        for run_id in jobs:
            await consistent(raw, run_id)


async def test_a_worker_frozen_between_started_and_its_tool_runs_no_tool_once_taken_over(shared_spec, tmp_path, spawn):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    # Given a worker process whose approval port is deciding on wire_money (not idempotent): the call's
    # started is stored, the tool has not run, and the worker's lease (1 s) is renewed meanwhile
    worker = spawn(*worker_args("run", shared_spec, tmp_path, "--job", "wire:wire-1:port"))
    blocked = await worker.next("blocked")
    async with opened(shared_spec) as raw:
        # When it is frozen (SIGSTOP) right after a renewal, and its lease lapses
        await frozen_past_its_lease(raw, "wire-1", worker, blocked)
        # And this process takes the run over: the wire in doubt asks for a decision; the operator
        # checks the bank (no wire went out) and says rerun; it wires once (this process approves)
        runner = FlowRunner(
            Executor(make_tickets(ledger).registry, approver=lambda request: True),
            checkpoints=raw, checkpoint_key=KEY, owner=TESTER,
        )  # fmt: skip
        with pytest.raises(RecoveryNeedsDecision):
            await runner.recover(ownership_worker.WIRE, "wire-1")
        await runner.decide_in_doubt(ownership_worker.WIRE, "wire-1", operator="ops")
        assert (await runner.recover(ownership_worker.WIRE, "wire-1")).status == "done"
        assert ledger.counts("wire-1") == {"wire_money": 1}

        # When the worker wakes up (SIGCONT) and its port approves
        (tmp_path / "gate").touch()
        worker.wake()
        end = (await worker.next("end"))["jobs"]["wire-1"]

        # Then it confirmed its lease before the tool, found it gone, and ran nothing: the wire went out once
        assert (end["outcome"], end["error"]) == ("refused", "LeaseLost"), end
        assert "the tool did not run" in end["message"] and "wire_money" in end["message"]
        assert end["ran"] == []
        assert ledger.counts("wire-1") == {"wire_money": 1}
        # And it wrote nothing after it woke (its writes: step 0 and the started before the freeze); the
        # run stands as this process finished it, and checks
        assert end["writes"] == ["save:0:running", "record:started:wire"], end
        await consistent(raw, "wire-1")


async def test_a_tool_frozen_before_its_effect_has_none_once_taken_over_when_it_confirms_its_lease(
    shared_spec, tmp_path, spawn
):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    # Given a worker process inside charge_card (not idempotent), before its effect, a tool that confirms
    # its worker's lease right before that effect (`CallInfo.confirm_held`); its lease is 1 s
    worker = spawn(*worker_args("run", shared_spec, tmp_path, "--job", "tickets:order-1:charge_card+confirm"))
    blocked = await worker.next("blocked")
    async with opened(shared_spec) as raw:
        # When it is frozen (SIGSTOP) right after a renewal, and its lease lapses
        await frozen_past_its_lease(raw, "order-1", worker, blocked)
        # And this process takes the run over: the charge in doubt asks for a decision; the operator checks
        # the card (no charge yet) and says rerun; the run ends, and the card is charged once
        runner = FlowRunner(Executor(make_tickets(ledger).registry), checkpoints=raw, checkpoint_key=KEY, owner=TESTER)
        with pytest.raises(RecoveryNeedsDecision, match="charge_card"):
            await runner.recover(TICKETS, "order-1")
        await runner.decide_in_doubt(TICKETS, "order-1", operator="ops")
        assert (await runner.recover(TICKETS, "order-1")).status == "done"
        assert ledger.counts("order-1")["charge_card"] == 1

        # When the worker wakes up (SIGCONT) inside the tool, which confirms its lease before the charge
        (tmp_path / "gate").touch()
        worker.wake()
        end = (await worker.next("end"))["jobs"]["order-1"]

        # Then the tool found the lease gone and stopped before its effect: the card was charged once
        assert (end["outcome"], end["error"]) == ("refused", "LeaseLost"), end
        assert "charge_card" in end["message"] and "stopped before its effect" in end["message"]
        assert "charge_card" not in end["ran"]
        assert ledger.counts("order-1")["charge_card"] == 1
        # And it wrote nothing after it woke (its last write: the pay node's started, before the freeze); the
        # run stands as this process finished it, and checks
        before_freeze = ["save:0:running", "record:started:hold", "record:done:hold", "save:1:running"]
        assert end["writes"] == [*before_freeze, "record:started:pay"], end
        await consistent(raw, "order-1")


# -- 3. takers racing for a lapsed lease -------------------------------------------------------


async def test_racers_for_a_lapsed_lease_exactly_one_wins(shared_spec, tmp_path, spawn):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    meet, go = tmp_path / "meet", tmp_path / "go"
    meet.mkdir()
    # Given a worker process inside charge_card of order-1 (started logged, no effect yet), its lease 1 s,
    # and three racer processes connected to the store
    victim = spawn(*worker_args("run", shared_spec, tmp_path, "--job", "tickets:order-1:charge_card"))
    race = ["--run-id", "order-1", "--parties", "3", "--meet", str(meet), "--go", str(go)]
    racers = [spawn(*worker_args("race", shared_spec, tmp_path, *race, "--me", str(n))) for n in range(3)]
    blocked = await victim.next("blocked")
    owners = [(await racer.next("ready"))["owner"] for racer in racers]
    async with opened(shared_spec) as raw:
        assert (await raw.leases(["order-1"]))["order-1"].owner == blocked["owner"]
        # When the worker is killed (SIGKILL) and its lease lapses
        victim.kill()
        await lapsed(raw, ["order-1"])
        # And the racers recover it at once (each waits at the lease's door for the others), rerunning calls in doubt
        go.touch()
        ends = [await racer.next("end") for racer in racers]

        # Then exactly one won and finished the run
        won = [end for end in ends if end["outcome"] == "won"]
        lost = [end for end in ends if end["outcome"] != "won"]
        assert len(won) == 1 and won[0]["status"] == "done", ends
        winner = won[0]
        assert winner["ran"] == ["charge_card", "email_tickets"]
        # And the others were refused (a racer held the run, or it had ended), having written and run nothing.
        # The holder a refusal names is a racer, never the dead worker: the winner, or, on a loaded machine,
        # a racer that took the lease and stalled past its 1 s before it could claim (the winner then took
        # the lapsed lease over, and fenced it).
        for end in lost:
            assert end["error"] in ("RunHeld", "CheckpointConflict"), end
            if end["error"] == "RunHeld":
                assert any(f"is held by {owner} until " in end["message"] for owner in owners), (end, owners)
                assert blocked["owner"] not in end["message"], end
            assert end["writes"] == [] and end["ran"] == [], end
        assert sorted(end["owner"] for end in ends) == sorted(owners)
        # And each effect happened once: the charge by the winner alone
        assert ledger.counts("order-1") == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
        await consistent(raw, "order-1")


async def test_a_restarted_process_takes_over_the_runs_of_its_earlier_life_at_once(shared_spec, tmp_path, spawn):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    async with opened(shared_spec) as raw:
        # Given a process named billing-api inside charge_card of order-1 (started, no effect yet), with 60 s leases
        args = ("--job", "tickets:order-1:charge_card", "--identity", "billing-api", "--lease-s", "60")
        worker = spawn(*worker_args("run", shared_spec, tmp_path, *args))
        owner = (await worker.next("blocked", run_id="order-1"))["owner"]
        assert re.fullmatch(r"billing-api#\d+", owner)
        # When it is killed (its lease stays for a minute: nobody released it)
        worker.kill()
        assert (await raw.leases(["order-1"]))["order-1"].owner == owner

        def runner(identity: str) -> FlowRunner:
            tools = make_tickets(ledger).registry
            return FlowRunner(Executor(tools), checkpoints=raw, checkpoint_key=KEY, identity=identity)

        # Then a process of another name is refused the run, as before
        with pytest.raises(RunHeld) as refused:
            await runner("billing-api-2").recover(TICKETS, "order-1")
        assert refused.value.owner == owner
        # But billing-api, started again, takes it over at once: the charge in doubt asks for a decision
        restarted = runner("billing-api")
        with pytest.raises(RecoveryNeedsDecision):
            await restarted.recover(TICKETS, "order-1")
        # and once told to rerun it (the card was not charged), it finishes the run, charging once
        await restarted.decide_in_doubt(TICKETS, "order-1", operator="ops")
        result = await restarted.recover(TICKETS, "order-1")
        assert result.status == "done"
        assert ledger.counts("order-1") == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
        # And a later process of the same name never takes a lease from a later life (nothing here holds one)
        assert await raw.leases(["order-1"]) == {}


async def test_recover_all_of_a_restarted_process_takes_over_the_runs_of_its_earlier_life_at_once(
    shared_spec, tmp_path, spawn
):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    async with opened(shared_spec) as raw:
        # Given a process named billing-api inside hold_seats (idempotent) of order-3, with 60 s leases
        args = ("--job", "tickets:order-3:hold_seats", "--identity", "billing-api", "--lease-s", "60")
        worker = spawn(*worker_args("run", shared_spec, tmp_path, *args))
        owner = (await worker.next("blocked", run_id="order-3"))["owner"]
        # When it is SIGKILLed (its lease stays for a minute: nobody released it)
        worker.kill()
        assert (await raw.leases(["order-3"]))["order-3"].owner == owner

        def runner(identity: str) -> FlowRunner:
            tools = make_tickets(ledger).registry
            return FlowRunner(Executor(tools), checkpoints=raw, checkpoint_key=KEY, identity=identity)

        # Then recover_all of a process of another name leaves the run to its holder, as before
        (held,) = (await runner("billing-api-2").recover_all(TICKETS)).values()
        assert isinstance(held, RunHeld) and held.owner == owner
        # But recover_all of billing-api, started again, takes it over at once, as its recover would,
        # and finishes it: the call in doubt is idempotent and reruns, the others run once
        (result,) = (await runner("billing-api").recover_all(TICKETS)).values()
        assert not isinstance(result, BaseException), result
        assert result.status == "done"
        assert ledger.counts("order-3") == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
        await consistent(raw, "order-3")


async def test_a_run_whose_starter_died_before_its_step_0_starts_again_under_the_same_id(shared_spec, tmp_path, spawn):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    async with opened(shared_spec) as raw:
        # Given a process that took the lease of order-7 to start it, and was killed before saving anything
        worker = spawn(*worker_args("run", shared_spec, tmp_path, "--hold", "order-7", "--lease-s", "60"))
        owner = (await worker.next("held", run_id="order-7"))["owner"]
        worker.kill()
        assert (await raw.leases(["order-7"]))["order-7"].owner == owner
        assert await raw.history("order-7") == [] and await raw.calls("order-7") == []
        # When the run is started again under the same id, at once (its dead starter's lease has a minute left)
        result = await runner_here(raw, ledger).run(TICKETS, ORDER, run_id="order-7")
        # Then it runs, each call once
        assert result.status == "done"
        assert ledger.counts("order-7") == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}
        # But a run with something stored is never started over its live holder
        worker = spawn(*worker_args("run", shared_spec, tmp_path, "--hold", "order-7", "--lease-s", "60"))
        await worker.next("held", run_id="order-7")
        with pytest.raises(RunHeld):
            await runner_here(raw, ledger).run(TICKETS, ORDER, run_id="order-7")
