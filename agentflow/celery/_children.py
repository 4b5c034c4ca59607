"""Child runs on the workers: a parent's `Child` node starts its child and leaves it to the queue.

A parent's superstep never drives its child: it saves the child's step 0 (a compare-and-set
on the child's derived run id, `agentflow.flow.children`), sends the child's first
superstep to its version's queue, and pauses. When the child ends, the worker that ended
it sends the parent a ``wake``; if that worker dies first, recover_all's sweep finds the
parent due (one of its children ended) and wakes it. Either way the parent's wake is a
signed claim, so the parent goes on once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from agentflow.flow import Child
from agentflow.flow.children import read_child, start_child

if TYPE_CHECKING:
    from agentflow.flow import FlowRunner, RunResult

#: Enqueues a superstep: ``(flow, run_id, step, cause, *, version)``.
Send = Callable[..., str]


class QueuedChildren:
    """`ChildRuns` for distributed workers: start the child and enqueue it; never drive it here."""

    def __init__(self, send: Send) -> None:
        self.send = send

    async def ensure(
        self, runner: FlowRunner, child: Child, state: BaseModel, run_id: str, parent: Mapping[str, Any]
    ) -> RunResult[Any]:
        """See `ChildRuns.ensure`: a child started now is only enqueued (it is ``running``)."""
        started = await start_child(runner, child, state, run_id, parent, limit=0)
        if started is None:
            return await read_child(runner, child, run_id, parent)
        version = child.flow.version
        await asyncio.to_thread(self.send, child.flow.name, run_id, 0, "start", version=version)
        return started
