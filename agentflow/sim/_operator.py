"""The simulation's operator: what a person at the console does about each run, through the public operations.

At each visit the operator reads a run with the audit read model (what ``agentflow verify``
and the viewer show) and, as a careful person would:
- decides the calls in doubt of a run nobody holds, after checking the world (the ledger):
  `Happened` with the result when the effect is there (now and then a careless `Rerun`),
  else `Rerun` or `DidNotHappen`; then sends the message that spends the decision;
- approves (or now and then denies) a paused run's pending calls, and sends the resume; at
  half the visits it lets them wait, so that an approval's deadline (the sweep's ``wake``)
  races the person's answer;
- retries a failed run (a tool loop refuses: noted), noting the failed calls without a ``done`` it runs again: a grant;
- now and then cancels a running run (not in the drain).
A verify problem is a broken invariant. Errors the operations answer with (the run moved
on, is held, or has nothing to decide any more) are what a person meets too: noted, and
looked at again at the next visit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentflow._errors import CheckpointConflict, CheckpointNotFound, FlowError, RecoveryNeedsDecision
from agentflow.celery.worker import Worker
from agentflow.exec.run.control import DidNotHappen, Happened, InDoubtDecision, Rerun
from agentflow.exec.run.read import read_run
from agentflow.sim._broker import Message

if TYPE_CHECKING:
    from agentflow.sim._simulation import Episode

#: The key every simulated process signs with.
KEY = b"agentflow-simulation-key-0123456789abcdef"
#: What a tool's result is when an operator declares that it happened.
PAST = {"look": "looked", "charge": "charged", "mail": "mailed", "wire": "wired"}


class Operator:
    """One operator of one episode, acting through its own worker process's store and runner."""

    def __init__(self, episode: Episode, worker: Worker) -> None:
        self.episode = episode
        self.worker = worker

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
        if report.status == "running" and report.lease is None and report.in_doubt:
            calls: dict[str, InDoubtDecision] = {}
            for call in report.in_doubt:
                calls[call.call_id] = self.decision(run_id, call.call_id, call.tool, call.args)
            step = await worker.runs.of(flow).decide_in_doubt(run_id, operator="sim-operator", calls=calls)
            ep.sched.note(f"operator: decided {run_id}: {sorted((c, type(d).__name__) for c, d in calls.items())}")
            ep.send(Message(flow, run_id, step, "rerun"))
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

    def decision(self, run_id: str, call_id: str, tool: str, args: Any) -> InDoubtDecision:
        """What the operator says about a call in doubt, after checking its system (the ledger)."""
        ep = self.episode
        if tool not in PAST:  # the tool loop's waiting tool: idempotent, and its result is a time; it runs again
            return Rerun()
        if ep.world.happened(run_id, call_id):
            if ep.rng.random() < 0.05:
                return Rerun()  # a careless operator: the invariant allows the rerun it signed
            order = args.get("order", "") if isinstance(args, dict) else ""
            return Happened(f"{PAST[tool]} {order}")
        return Rerun() if ep.rng.random() < 0.8 else DidNotHappen("the simulation's operator found no trace")
