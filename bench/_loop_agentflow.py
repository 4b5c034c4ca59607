"""agentflow's side of `bench.loop_durability`: the scripted tool loop, and a probe of what one run writes.

`Loop` runs `run_tool_loop` over agentflow's `ScriptedModel` with P5's texts (`bench.loop_storage`)
and one cheap tool. `probe` runs it once on a store and counts, from the outside, every call
the loop makes on the store (by method; a store method calling another of its own is not
counted again), then reads back the run's checkpoints and call records and their bytes as
stored (payload, signature, key id, ids).
"""

from __future__ import annotations

import inspect
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from agentflow import Registry
from agentflow.exec import run_tool_loop
from agentflow.models import ScriptedModel
from bench.loop_storage import conversation

#: The tool's result, the same for every call (P5's size).
RESULT = ("result: " + "lorem ipsum dolor sit amet consectetur adipiscing elit " * 8)[:400]


@dataclass
class Loop:
    """The scripted conversation of `stages` stages, run by agentflow's tool loop."""

    stages: int

    def __post_init__(self) -> None:
        self.initial, self.replies = conversation(self.stages)
        self.registry = Registry()

        @self.registry.tool(idempotent=True)
        async def lookup(query: str) -> str:
            """Look something up."""
            return RESULT

    async def run(self, store: Any = None, key: bytes | None = None) -> str:
        model = ScriptedModel(self.replies)
        result = await run_tool_loop(
            model, self.registry, self.initial, checkpoints=store, checkpoint_key=key, max_steps=self.stages + 1
        )
        assert result.status == "done" and model.calls == self.stages + 1, result
        return result.run_id


#: Set while a counted store method runs, so the calls it makes on its own store are not counted again.
_inside: ContextVar[bool] = ContextVar("_inside", default=False)


async def probe(loop: Loop, store: Any, key: bytes | None) -> dict[str, Any]:
    """One run on `store`: its checkpoints, call records, row bytes and store calls by method."""
    made: Counter[str] = Counter()
    names = [n for n, f in inspect.getmembers(type(store)) if not n.startswith("_") and inspect.iscoroutinefunction(f)]

    def counting(name: str) -> Any:
        method = getattr(store, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if _inside.get():  # the store calling itself (a save through save_after_calls, a lazy setup)
                return await method(*args, **kwargs)
            made[name] += 1
            token = _inside.set(True)
            try:
                return await method(*args, **kwargs)
            finally:
                _inside.reset(token)

        return call

    for name in names:
        setattr(store, name, counting(name))
    try:
        run_id = await loop.run(store, key)
    finally:
        for name in names:
            store.__dict__.pop(name, None)
    cps, calls = await store.history(run_id), await store.calls(run_id)
    ids = len(run_id.encode())
    row_bytes = sum(len(c.payload) + len(c.sig) + len(c.kid) + ids + len(c.flow) + len(c.status) for c in cps)
    row_bytes += sum(len(c.payload) + len(c.sig) + len(c.kid) + ids + len(c.kind) for c in calls)
    return {"checkpoints": len(cps), "records": len(calls), "bytes": row_bytes, "calls": dict(made)}
