"""One superstep: run the frontier concurrently, merge the updates, pick the next frontier.

Each node sees its own copy of the state as it was when the superstep began, so nodes
of one superstep cannot see each other's changes. Updates are merged in the order nodes
were added to the flow, which makes the result independent of timing. A field written
by two nodes of one superstep must declare how to combine them (``Annotated[T, fn]``);
such a field combines every write, also a single one, with its current value.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from agentflow._errors import ApprovalDenied, FlowError
from agentflow._events import Events
from agentflow.exec.calls.log import CallLog, PauseForApproval
from agentflow.exec.run.cancel import CancelRequested
from agentflow.flow._graph import _RAISE, Call, Child, Flow, Map, Node, Wait
from agentflow.flow._map import run_map
from agentflow.flow.children import PauseForChild, run_child

if TYPE_CHECKING:
    from agentflow.flow._runner import FlowRunner


class NodeHandle:
    """What a node function gets besides the state: the way to call tools."""

    def __init__(self, node: str, log: CallLog, loop: asyncio.AbstractEventLoop) -> None:
        self.node = node
        self._log = log
        self._loop = loop
        self._ordinal = 0

    @property
    def run_id(self) -> str:
        """The run this node runs in."""
        return self._log.run_id

    async def call(self, tool: str, /, **args: Any) -> Any:
        """Call a tool through the executor (logged, and replayed after a crash)."""
        ordinal = self._ordinal
        self._ordinal += 1
        return await self._log.call(self.node, ordinal, tool, args)

    def call_sync(self, tool: str, /, **args: Any) -> Any:
        """Call a tool from a sync node function (it runs in a worker thread)."""
        if _on_loop(self._loop):
            raise RuntimeError("call_sync is for sync node functions; an async node awaits handle.call(...)")
        return asyncio.run_coroutine_threadsafe(self.call(tool, **args), self._loop).result()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


@dataclass
class Outcome:
    """What a superstep produced."""

    state: BaseModel
    frontier: list[str]
    visits: dict[str, int]
    paused: bool = False
    ran: list[str] = field(default_factory=list)
    wake_at: float | None = None
    """When the next superstep may start, if a `Wait` node ran (seconds since the epoch)."""
    children: list[str] = field(default_factory=list)
    """The child runs the paused superstep waits for."""


async def _run_node(
    flow: Flow[Any],
    node: Node,
    state: BaseModel,
    log: CallLog,
    events: Events,
    detoured: bool = False,
    runner: FlowRunner | None = None,
) -> dict[str, Any]:
    events.emit("node.started", log.run_id, node=node.name, superstep=log.superstep)
    view = state.model_copy(deep=True)
    handle = NodeHandle(node.name, log, asyncio.get_running_loop())
    action = node.action
    if isinstance(action, Call):
        try:
            result = await handle.call(action.tool, **action.arguments(view))
        except ApprovalDenied:
            if detoured and (action.on_deny is _RAISE or action.into is None):
                result, action = None, Call(action.tool)  # its deadline passed: the run goes on elsewhere
            elif action.on_deny is _RAISE or action.into is None:
                raise
            else:
                result = action.on_deny
        update: Any = {action.into: result} if action.into else {}
    elif isinstance(action, Wait):
        update = {}  # its wake time is the superstep's (`run_superstep`)
    elif isinstance(action, Map):
        update = await run_map(node.name, action, view, log)
    elif isinstance(action, Child):
        if runner is None:
            raise FlowError(f"flow {flow.name!r}, node {node.name!r}: a Child node needs a runner to start its run")
        update = await run_child(node.name, action, view, log, runner)
    else:
        params = (view, handle) if node.takes_handle else (view,)
        update = await action(*params) if node.is_async else await asyncio.to_thread(action, *params)
    if update is None:
        update = {}
    if not isinstance(update, Mapping):
        raise FlowError(
            f"flow {flow.name!r}, node {node.name!r} returned {type(update).__name__}; "
            "return a dict of the fields it changes, or None"
        )
    events.emit("node.finished", log.run_id, node=node.name, superstep=log.superstep)
    return dict(update)


async def run_superstep(
    flow: Flow[Any],
    state: BaseModel,
    frontier: list[str],
    visits: Mapping[str, int],
    log: CallLog,
    events: Events,
    detours: Mapping[str, str] | None = None,
    runner: FlowRunner | None = None,
) -> Outcome:
    """Run one superstep of `flow`.

    `detours` maps a node whose approval deadline passed to the node the run goes on from
    instead of that node's edges (its call was denied by the deadline).

    Raises:
        FlowError: a node ran past its visit limit, two nodes wrote one plain field, an
            update does not fit the state, or no edge leads on from a node that is not an end.
        Exception: whatever a node or tool raised (the other nodes are cancelled).
    """
    counted = dict(visits)
    for name in frontier:
        counted[name] = counted.get(name, 0) + 1
        if counted[name] > flow.nodes[name].max_visits:
            raise FlowError(
                f"flow {flow.name!r}: node {name!r} would run a {counted[name]}th time, past its limit of "
                f"{flow.nodes[name].max_visits}; raise max_visits or make the cycle end"
            )
    paused: set[str] = set()
    children: list[str] = []

    async def guarded(node: Node) -> dict[str, Any]:
        try:
            return await _run_node(flow, node, state, log, events, node.name in (detours or {}), runner)
        except PauseForApproval:
            paused.add(node.name)
            return {}
        except PauseForChild as waiting:
            paused.add(node.name)
            children.append(waiting.run_id)
            return {}
        except CancelRequested:  # the node's call did not start; the others finish theirs (the driver then stops)
            return {}

    if len(frontier) == 1:  # nothing to run beside it: no task needed
        results = [await guarded(flow.nodes[frontier[0]])]
    else:
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(guarded(flow.nodes[name])) for name in frontier]
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None
        results = [task.result() for task in tasks]
    if paused or log.pending:
        return Outcome(state, frontier, dict(visits), paused=True, children=children)
    updates = list(zip(frontier, results, strict=True))
    merged = merge(flow, state, updates)
    waits = [node.action for node in (flow.nodes[n] for n in frontier) if isinstance(node.action, Wait)]
    now = time.time()
    wake_at = max((wait.wake_at(state, now) for wait in waits), default=None)
    following = next_frontier(flow, merged, frontier, detours or {})
    return Outcome(merged, following, counted, ran=list(frontier), wake_at=wake_at)


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_error(first) if isinstance(first, BaseExceptionGroup) else first


def merge(flow: Flow[Any], state: BaseModel, updates: list[tuple[str, dict[str, Any]]]) -> BaseModel:
    """Apply the updates of one superstep to `state` (see the module docstring)."""
    values = dict(state)
    writers: dict[str, str] = {}
    for node, update in updates:
        for key, value in update.items():
            if key not in flow.state.model_fields:
                raise FlowError(f"flow {flow.name!r}, node {node!r} returned field {key!r}, which the state lacks")
            reducer = flow.reducers.get(key)
            if reducer is not None:
                values[key] = reducer(values[key], value)
            elif key in writers:
                raise FlowError(
                    f"flow {flow.name!r}: nodes {writers[key]!r} and {node!r} both wrote {key!r} in one superstep; "
                    f"declare how to combine them, e.g. Annotated[list[str], operator.add]"
                )
            else:
                values[key] = value
            writers.setdefault(key, node)
    try:
        merged: BaseModel = flow.state.model_validate(values)
    except ValidationError as exc:
        raise FlowError(f"flow {flow.name!r}: the merged update does not fit {flow.state.__name__}: {exc}") from None
    return merged


def next_frontier(
    flow: Flow[Any], state: BaseModel, ran: list[str], detours: Mapping[str, str] | None = None
) -> list[str]:
    """The nodes of the next superstep, in the order they were added (a join runs once; a detour replaces edges)."""
    chosen: set[str] = set()
    for name in ran:
        if detours and name in detours:
            chosen.add(detours[name])
            continue
        followed = False
        for edge in flow.edges:
            if edge.src == name and (edge.when is None or edge.when(state)):
                chosen.add(edge.dst)
                followed = True
        if not followed and name not in flow.ends:
            raise FlowError(f"flow {flow.name!r}: no edge out of {name!r} matched the state, and it is not an end")
    return [n for n in flow.nodes if n in chosen]
