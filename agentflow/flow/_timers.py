"""A flow's timers: an approval's deadline, what it decides, and the in-process sweeper that wakes due runs.

The rules of a timer (where its wake time lives, when it is due, that a wake is a claim)
are in `agentflow.exec.run.timers`; this module holds what is a flow's own:
- `approval_deadline`: a run pausing for approvals gets a deadline when every pending
  call's node gives one (``Call(timeout_s=...)``): the earliest of them. A pending call
  without a deadline waits for a person, and so does the run.
- `settle_deadline`: at the deadline, each pending call is decided by its node's
  ``on_timeout``: approved, denied, or denied with the run going on from another node.
- `wake_due` / `run_timers`: for in-process users, one pass (or a loop) over a flow's
  unfinished runs that wakes each paused run whose timer is due. Distributed workers do
  the same in their recover_all sweep, on the beat.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentflow._errors import CheckpointConflict, CheckpointNotFound, CheckpointStoreCorrupt
from agentflow.exec import ApprovalRequest
from agentflow.exec.calls.log import Decision
from agentflow.exec.run.timers import NotDue, due_at
from agentflow.flow._graph import Call, Flow
from agentflow.flow._result import RunResult
from agentflow.flow._versions import FlowLike, as_versions

if TYPE_CHECKING:
    from agentflow.flow._driver import Cursor
    from agentflow.flow._runner import FlowRunner

log = logging.getLogger("agentflow.timers")


def _call_of(flow: Flow[Any], request: ApprovalRequest) -> Call | None:
    node = flow.nodes.get(request.node)
    return node.action if node is not None and isinstance(node.action, Call) else None


def approval_deadline(flow: Flow[Any], pending: Sequence[ApprovalRequest], now: float) -> dict[str, Any] | None:
    """The timer of a run pausing for `pending`: the earliest deadline, if every pending call has one."""
    limits = [call.timeout_s if (call := _call_of(flow, req)) is not None else None for req in pending]
    if not limits or any(limit is None for limit in limits):
        return None
    return {"at": now + min(limit for limit in limits if limit is not None), "for": "approval"}


def settle_deadline(cur: Cursor, wake: Mapping[str, Any]) -> dict[str, Any]:
    """Decide each pending call of a run whose approval deadline passed; return what the claim records."""
    note = "the approval's deadline passed"
    decided: dict[str, str] = {}
    for request in cur.pending:
        call = _call_of(cur.flow, request)
        choice = call.on_timeout if call is not None else "deny"
        cur.decisions[request.call_id] = Decision(choice == "approve", note)
        decided[request.call_id] = "approve" if choice == "approve" else "deny"
        if choice not in ("approve", "deny"):
            cur.detours[request.node] = choice
    cur.pending = []
    return {"decided": decided} | ({"detours": dict(cur.detours)} if cur.detours else {})


async def wake_due(runner: FlowRunner, flow: FlowLike[Any], *, now: float | None = None) -> dict[str, Any]:
    """Wake every paused run of `flow` whose timer is due; each run id maps to its result or its error.

    Runs that are not due, or that someone else woke or resumed first, are left out.
    """
    store, sealer = runner.checkpoints, runner.sealer
    if store is None or sealer is None:
        raise ValueError("timers need a FlowRunner with a checkpoint store")
    flows = as_versions(flow)
    clock = time.time() if now is None else now
    woken: dict[str, Any] = {}
    for run_id in await store.list_unfinished(flows.name):
        try:
            row = await store.latest(run_id)
            at = due_at(row, sealer.open_checkpoint(row, run_id))
        except (CheckpointNotFound, CheckpointStoreCorrupt):
            continue  # gone since it was listed, or for recover_all and the operators to report
        if at is None or at > clock:
            continue
        try:
            woken[run_id] = await runner.wake(flows, run_id, expected_step=row.step, now=clock)
        except (NotDue, CheckpointConflict) as exc:  # another sweeper, or a person, was first
            log.debug("run %s was not woken: %s", run_id, exc, extra={"run_id": run_id})
        except Exception as exc:  # reported, not raised: one bad run must not stop the others
            woken[run_id] = exc
    return woken


async def run_timers(runner: FlowRunner, flow: FlowLike[Any], *, every_s: float) -> None:
    """Wake `flow`'s due runs every `every_s` seconds, until cancelled."""
    if every_s <= 0:
        raise ValueError(f"every_s must be positive, not {every_s}")
    while True:
        for run_id, outcome in (await wake_due(runner, flow)).items():
            if isinstance(outcome, RunResult):
                log.info("woke run %s: now %s", run_id, outcome.status, extra={"run_id": run_id})
            else:
                log.warning("could not wake run %s: %s", run_id, outcome, extra={"run_id": run_id})
        await asyncio.sleep(every_s)
