"""The simulation's operator: what a person at the console does about each run, through the public operations.

At each visit the operator reads a run with the audit read model (what ``agentflow verify``
and the viewer show) and, as a careful person would:
- decides the calls in doubt of a run nobody holds (running, or paused with its step's calls in
  doubt), after checking the world (the ledger):
  `Happened` with the result when the effect is there (now and then a careless `Rerun`),
  else `Rerun` or `DidNotHappen`; then sends the message that spends the decision;
- approves (or now and then denies) a paused run's pending calls, and sends the resume; at
  half the visits it lets them wait, so that an approval's deadline (the sweep's ``wake``)
  races the person's answer;
- retries a failed run (a tool loop refuses: noted), noting the failed calls without a ``done`` it runs again: a grant;
- now and then cancels a running run (not in the drain);
- now and then (not in the drain) forks a flow run from one of its checkpoints, and moves an
  unfinished run of an older flow version onto the newest (``migrate``, refused where the
  docs refuse it: a call of the step it goes on with finished or in doubt).
The operator runs the code deployed now (`_deploys`): a call in doubt whose tool it no longer
has (renamed or removed) it still decides, from the ledger.
A verify problem is a broken invariant. Errors the operations answer with (the run moved
on, is held, or has nothing to decide any more) are what a person meets too: noted, and
looked at again at the next visit.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from agentflow._errors import CheckpointConflict, CheckpointNotFound, FlowError, RecoveryNeedsDecision
from agentflow._run_types import RunKind
from agentflow.celery.worker import Worker
from agentflow.exec.run.control import DidNotHappen, Happened, InDoubtDecision, Rerun
from agentflow.exec.run.read import read_run
from agentflow.exec.run.view import RunReport
from agentflow.sim._broker import Message
from agentflow.sim._world import PAST

if TYPE_CHECKING:
    from agentflow.sim._simulation import Episode

#: The key every simulated process signs with.
KEY = b"agentflow-simulation-key-0123456789abcdef"
#: The most forks an operator makes in one episode (each is a run that must end too).
FORKS = 2


class Operator:
    """One operator of one episode, acting through its own worker process's store and runner."""

    def __init__(self, episode: Episode, worker: Worker) -> None:
        self.episode = episode
        self.worker = worker
        self.forked = 0

    async def visit(self, run_id: str, flow: str) -> None:
        """Look at one run and act on it; what the operations refuse is noted, not raised."""
        try:
            await self._act(run_id, flow)
        except (CheckpointConflict, CheckpointNotFound, FlowError, RecoveryNeedsDecision, ValueError) as exc:
            self.episode.sched.note(f"operator: {run_id}: {type(exc).__name__}: {exc}")

    async def _act(self, run_id: str, flow: str) -> None:
        ep, worker = self.episode, self.worker
        report = await read_run(worker.store, worker.sealer, run_id)
        if report.problems:
            ep.world.verify_reports(run_id, report.problems)
            return
        if await self._decide(report, run_id, flow):
            return
        cancel = report.status == "running" and not ep.draining and ep.rng.random() < ep.config.cancel
        run = worker.runs.of(flow)
        answers = ep.draining or ep.rng.random() < 0.5  # else the approval waits (for its deadline, if it has one)
        if report.status == "paused" and report.lease is None and report.pending and answers:
            approve = ep.rng.random() < 0.9
            result = await run.resume(run_id, approve=approve, max_supersteps=0, operator="sim-operator")
            ep.sched.note(f"operator: {'approved' if approve else 'denied'} {run_id}")
            if result.step is not None:
                ep.send(Message(flow, run_id, result.step, "resume"))
        elif report.status == "failed" and report.lease is None:
            # A grant to run again each failed call whose own `done` is not in the log: a failed call
            # that has one (a stalled worker's late `done`) must replay, and a retry running it again
            # is a bug. Read from the stored records by the world, not from the read model under test.
            finished = await ep.world.finished_calls(run_id)
            failed = [c.call_id for c in report.calls if c.state == "failed" and c.call_id not in finished]
            result = await run.retry(run_id, operator="sim-operator", max_supersteps=0)
            ep.world.retries.update((run_id, call_id) for call_id in failed)
            ep.sched.note(f"operator: retried {run_id} (failed calls: {failed})")
            if result.step is not None:
                ep.send(Message(flow, run_id, result.step, "retry"))
        elif cancel:
            await run.cancel(run_id, reason="the simulation's operator changed their mind")
            ep.sched.note(f"operator: cancelled {run_id}")
        elif not ep.draining and report.kind is RunKind.FLOW and drawn(ep, ep.config.fork):
            await self.fork(run_id, flow, [c.step for c in report.checkpoints])
        elif not ep.draining and report.status in ("running", "paused") and report.lease is None:
            if drawn(ep, ep.config.migrate):
                await self.migrate(run_id, flow)

    async def _decide(self, report: RunReport, run_id: str, flow: str) -> bool:
        """Decide the calls in doubt of a run nobody holds, if it has any to decide; whether it did."""
        ep, worker = self.episode, self.worker
        # A paused run's step may hold calls in doubt too: decided alike, it stays paused until its resume.
        undecided = report.status == "running" or report.decision is None
        if not (undecided and report.lease is None and report.in_doubt):
            return False
        calls: dict[str, InDoubtDecision] = {}
        registry = (
            worker.flow_app.loops[report.name].registry if report.kind is RunKind.LOOP else worker.flow_app.registry
        )
        for call in report.in_doubt:
            gone = call.tool not in registry
            calls[call.call_id] = self.decision(run_id, call.call_id, call.tool, call.args, gone=gone)
        step = await worker.runs.of(flow).decide_in_doubt(run_id, operator="sim-operator", calls=calls)
        ep.sched.note(f"operator: decided {run_id}: {sorted((c, type(d).__name__) for c, d in calls.items())}")
        if report.status == "running":  # a paused run's decision waits for its resume
            ep.send(Message(flow, run_id, step, "rerun"))
        return True

    async def fork(self, run_id: str, flow: str, steps: list[int]) -> None:
        """Fork `run_id` from one of its checkpoints (at most `FORKS` an episode); a worker runs the new run."""
        ep = self.episode
        if self.forked >= FORKS or not steps:
            return
        self.forked += 1
        at_step, new_id = ep.deploy_rng.choice(steps), f"{run_id}-fork{self.forked}"
        ep.world.forking.add(run_id)
        try:
            result = await self.worker.runs.of(flow).fork(
                run_id, at_step=at_step, new_run_id=new_id, operator="sim-operator", max_supersteps=0
            )
        finally:
            ep.world.forking.discard(run_id)
        ep.world.forks[new_id] = run_id
        ep.flows[new_id] = flow
        ep.sched.note(f"operator: forked {run_id} at step {at_step} as {new_id}")
        ep.send(Message(flow, new_id, result.step or 0, "start"))

    async def migrate(self, run_id: str, flow: str) -> None:
        """Move a run of an older version onto the newest deployed (refused where a call of its step acted)."""
        ep = self.episode
        versions = self.worker.flow_app.versions.get(flow)
        if versions is None or len(versions.versions) < 2:
            return  # a tool loop, or a flow with one version
        if json.loads((await ep.raw.latest(run_id)).payload).get("version") == versions.newest.version:
            return
        result = await self.worker.runs.of(flow).migrate(run_id, operator="sim-operator", max_supersteps=0)
        ep.sched.note(f"operator: migrated {run_id} to version {result.version}")
        if result.step is not None:
            ep.send(Message(flow, run_id, result.step, "migrate"))

    def decision(self, run_id: str, call_id: str, tool: str, args: Any, *, gone: bool = False) -> InDoubtDecision:
        """What the operator says about a call in doubt, after checking its system (the ledger).

        A call whose tool is `gone` from the code deployed now (renamed or removed) that happened
        cannot be decided `Happened`: its result cannot be checked against a tool that is not
        registered (a `ValueError`). The operator reruns it instead, which runs nothing: the
        tool is not there (a tool loop tells its model so).
        """
        ep = self.episode
        if tool not in PAST:  # the tool loop's waiting tool: idempotent, and its result is a time; it runs again
            return Rerun()
        if gone and ep.world.happened(run_id, call_id):
            ep.sched.note(f"operator: {tool} of {run_id} is gone from the code deployed now: rerun (runs nothing)")
            return Rerun()
        if ep.world.happened(run_id, call_id):
            if ep.rng.random() < 0.05:
                return Rerun()  # a careless operator: the invariant allows the rerun it signed
            order = args.get("order", "") if isinstance(args, dict) else ""
            return Happened(f"{PAST[tool]} {order}")
        return Rerun() if ep.rng.random() < 0.8 else DidNotHappen("the simulation's operator found no trace")


def drawn(ep: Episode, chance: float) -> bool:
    """Whether a fork or migration is made now, from the deploys' generator (nothing is drawn at chance 0)."""
    return bool(chance) and ep.deploy_rng.random() < chance
