"""Child flows: a node that starts another flow as a child run and waits for its end, durably.

Moving parts:
- `Child` (the node kind, in `_nodes`) names the child flow, how its state is made from the
  parent's, and where its result goes.
- The child's run id is derived from the parent's call: ``<parent>.<node>.<superstep>``, so
  a parent that crashes and runs the node again finds the same child instead of starting a
  second one. The child's step 0 is a compare-and-set on that id: of two attempts one
  starts it. Every checkpoint of the child carries its signed lineage (``parent``: the
  parent run, node and superstep); a run found under the id with another lineage (or none)
  is refused, never adopted.
- `ChildRuns` is how a runner carries children on: `InlineChildren` (in process) drives the
  child to its end or its first pause right there; a distributed deployment only starts it
  and enqueues its first superstep (`agentflow.celery`).
- While a child is unfinished, the parent pauses with a signed timer of its own kind
  (``wake: {"for": "child", "runs": [...]}``); it is due once a child ended
  (`agentflow.exec.run.timers`), and the wake reruns the parent's superstep, which then
  finds the child's result. A child that failed or was cancelled fails the parent's node.
- Cancelling a parent cancels the children it waits for (`FlowDriver.children`, which the
  run protocol's cancel asks), and theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

from agentflow._errors import CheckpointConflict, FlowError
from agentflow._identity import identity_body
from agentflow._run_types import RunStatus
from agentflow.flow._nodes import Child

if TYPE_CHECKING:
    from agentflow.exec.calls.log import CallLog
    from agentflow.flow._result import RunResult
    from agentflow.flow._runner import FlowRunner


class PauseForChild(Exception):
    """Internal signal: a child run has not ended yet; the parent's superstep pauses for it."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


class ChildEnded(Exception):
    """A child run ended failed or cancelled: the parent's node fails with it (the parent fails like on any error)."""


def child_run_id(parent: str, node: str, superstep: int) -> str:
    """The run id of the child a parent's node starts in a superstep (the same on every attempt)."""
    return f"{parent}.{node}.{superstep}"


class ChildRuns(Protocol):
    """How a runner starts a child run and carries it on."""

    async def ensure(
        self, runner: FlowRunner, child: Child, state: BaseModel, run_id: str, parent: Mapping[str, Any]
    ) -> RunResult[Any]:
        """Start the child (unless it was started already), carry it on as far as this runner does, and return it."""


class InlineChildren:
    """Children in process: each is driven, right there, to its end or its first pause."""

    async def ensure(
        self, runner: FlowRunner, child: Child, state: BaseModel, run_id: str, parent: Mapping[str, Any]
    ) -> RunResult[Any]:
        """See `ChildRuns.ensure`."""
        started = await start_child(runner, child, state, run_id, parent, limit=None)
        if started is not None:
            return started
        found = await read_child(runner, child, run_id, parent)
        if found.status == RunStatus.RUNNING:  # started before a crash: carry it on now
            return await runner.recover(child.flow, run_id)
        return found


async def start_child(
    runner: FlowRunner, child: Child, state: BaseModel, run_id: str, parent: Mapping[str, Any], *, limit: int | None
) -> RunResult[Any] | None:
    """Start the child run (step 0 with its signed lineage, then up to `limit` supersteps); None if the id is taken."""
    from agentflow.flow._driver import Cursor

    flow = child.flow
    proto = runner.protocol(flow)
    cur = Cursor(run_id, identity_body(runner.sealer, run_id, None), None, flow, state, [flow.entry], {}, 0)
    cur.parent = dict(parent)
    try:
        result: RunResult[Any] = await proto.begin(cur, limit)
    except CheckpointConflict:
        return None  # started already (by this parent's earlier attempt, or another worker)
    return result


async def read_child(runner: FlowRunner, child: Child, run_id: str, parent: Mapping[str, Any]) -> RunResult[Any]:
    """The child run as it stands, once its signed lineage shows it is this parent's.

    Raises:
        FlowError: the run under the child's id belongs to no parent, or to another one.
    """
    proto = runner.protocol(child.flow)
    opened = await proto.steps.open(run_id, None, identity=False)
    if opened.cur.parent != dict(parent):
        raise FlowError(
            f"run {run_id!r} is not the child of {parent.get('run')!r} that its id says (its lineage is "
            f"{opened.cur.parent!r}); it was not started by this parent and is not adopted"
        )
    result: RunResult[Any] = proto.driver.result(opened.cur, RunStatus(opened.status))
    return result


async def run_child(node: str, spec: Child, state: BaseModel, log: CallLog, runner: FlowRunner) -> dict[str, Any]:
    """The state update of a `Child` node: the child's result once it ended.

    Raises:
        PauseForChild: the child has not ended yet.
        ChildEnded: the child failed or was cancelled.
        FlowError: the run under the child's id is not this parent's child.
    """
    run_id = child_run_id(log.run_id, node, log.superstep)
    parent = {"run": log.run_id, "node": node, "superstep": log.superstep}
    child_state = spec.initial(state)
    children = runner.children
    result = await children.ensure(runner, spec, child_state, run_id, parent)
    if result.status == RunStatus.DONE:
        value = result.state.model_dump(mode="json") if spec.result is None else spec.result(result.state)
        return {} if spec.into is None else {spec.into: value}
    if result.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        raise ChildEnded(f"child run {run_id!r} of flow {spec.flow.name!r} ended {result.status}: {result.error}")
    raise PauseForChild(run_id)
