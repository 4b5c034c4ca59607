"""Count the agentflow modules and functions one in-process superstep passes through (issue 50's figure).

A two-node flow whose first node calls a tool runs once on a SQLite store to warm up (imports,
table creation); then a second run is traced with ``sys.setprofile`` from its start to its end,
and every Python function called whose module is under ``agentflow`` is counted. The run is two
supersteps (the tool call's, then the plain node's) plus its start; the figure is per run, the
same way each time it is measured.

Usage: ``python scripts/superstep_modules.py`` (prints the counts and, with ``-v``, the modules).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry
from agentflow.exec.checkpoints import SQLiteCheckpointStore

KEY = b"superstep-modules-measure-key-32"


class Order(BaseModel):
    """The measured flow's state."""

    show: str
    held: str = ""
    done: bool = False


registry = Registry()


@registry.tool(idempotent=True)
async def hold_seats(show: str) -> str:
    """The tool the first superstep calls."""
    return f"held {show}"


def finish(state: Order) -> dict[str, Any]:
    """The plain node of the second superstep."""
    return {"done": True}


FLOW = (
    Flow("order", Order)
    .node("hold", Call("hold_seats", args=lambda s: {"show": s.show}, into="held"))
    .node("finish", finish)
    .edge("hold", "finish")
    .end("finish")
)


async def measure() -> tuple[set[str], set[tuple[str, str]]]:
    """The agentflow modules and (module, function) pairs the traced run called."""
    modules: set[str] = set()
    functions: set[tuple[str, str]] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name == "agentflow" or name.startswith("agentflow."):
                modules.add(name)
                functions.add((name, frame.f_code.co_qualname))

    with tempfile.TemporaryDirectory() as folder:
        async with SQLiteCheckpointStore(Path(folder) / "runs.db") as store:
            runner = FlowRunner(Executor(registry), checkpoints=store, checkpoint_key=KEY)
            await runner.run(FLOW, Order(show="warm-up"), run_id="warm-up")
            sys.setprofile(profile)
            try:
                result = await runner.run(FLOW, Order(show="measured"), run_id="measured")
            finally:
                sys.setprofile(None)
            assert result.status == "done", result
    return modules, functions


def main() -> None:
    """Print the counts."""
    modules, functions = asyncio.run(measure())
    print(
        f"one in-process run of two supersteps on SQLite: {len(modules)} agentflow modules, {len(functions)} functions"
    )
    if "-v" in sys.argv:
        for name in sorted(modules):
            print(" ", name)


if __name__ == "__main__":
    main()
