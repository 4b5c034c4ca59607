"""Running a `Map` node: one logged call per element, bounded concurrency, results in input order.

Each element's call goes through the superstep's call log with the element's index as its
ordinal, so its identity (``superstep/node/index/argument digest``) is the same on every
worker and after any crash: a recovery replays the finished elements and applies the
in-doubt rules to the others. All elements are attempted even when one fails or waits for
an approval, so every element that can finish is logged before the node reports:
- an element waiting for an approval pauses the node (after the others are done);
- a cancel request stops the elements that did not start;
- otherwise a failed element fails the node, unless the node collects errors.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from agentflow.exec.calls.log import PauseForApproval, describe_failure
from agentflow.exec.run.cancel import CancelRequested
from agentflow.flow._nodes import Map

if TYPE_CHECKING:
    from pydantic import BaseModel

    from agentflow.exec.calls.log import CallLog


async def run_map(node: str, spec: Map, state: BaseModel, log: CallLog) -> dict[str, Any]:
    """The state update of one `Map` node (its results, and its errors when collected).

    Raises:
        PauseForApproval: an element waits for an approval (the others finished first).
        CancelRequested: the run is being cancelled.
        Exception: the first failed element's error, unless the node collects errors.
    """
    elements = spec.elements(state)
    gate = asyncio.Semaphore(spec.max_concurrency)

    dying: list[BaseException] = []

    async def one(index: int, element: Any) -> Any:
        async with gate:
            if dying:  # the worker is going down: start nothing more (the task group cancels the rest)
                raise dying[0]
            try:
                return await log.call(node, index, spec.tool, spec.arguments(element))
            except Exception as exc:  # kept, so the other elements finish and are logged
                return _Failed(exc)
            except BaseException as exc:
                dying.append(exc)
                raise

    try:  # anything but an Exception (the worker dying) stops every element at once
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(i, e)) for i, e in enumerate(elements)]
    except BaseExceptionGroup as died:
        raise _first(died) from None
    outcomes = [task.result() for task in tasks]
    for stop in (CancelRequested, PauseForApproval):
        found = next((o.error for o in outcomes if isinstance(o, _Failed) and isinstance(o.error, stop)), None)
        if found is not None:
            raise found
    failed = {i: o.error for i, o in enumerate(outcomes) if isinstance(o, _Failed)}
    if failed and not spec.collect_errors:
        raise failed[min(failed)]
    update: dict[str, Any] = {}
    if spec.into is not None:
        update[spec.into] = [None if i in failed else o for i, o in enumerate(outcomes)]
    if spec.errors_into is not None:
        update[spec.errors_into] = {str(i): describe_failure(e) for i, e in failed.items()}
    return update


class _Failed:
    """An element whose call raised (kept apart from results, which may be anything)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
