"""What the worker processes of the recovery benchmark (`bench.recovery`) import.

``bench._recovery_app:app`` is a `FlowApp` with ``held``: a one-node flow whose idempotent
tool, ``hold``, sleeps `HOLD_S` seconds the first time it is called for a run and returns
at once when it is called again (the rerun after its worker was killed). The first call
leaves a file named after the run in the directory ``BENCH_RECOVERY_GATE`` names, so the
benchmark sees when each run is inside its tool call.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry

#: How long the first call of the tool lasts: far longer than it takes to kill its worker.
HOLD_S = 300.0
#: The flow's name.
FLOW = "held"

registry = Registry()


def gate(token: str) -> Path:
    """The file the tool's first call leaves for the run called `token`."""
    return Path(os.environ["BENCH_RECOVERY_GATE"]) / token


@registry.tool(idempotent=True)
async def hold(token: str) -> str:
    """Sleep a long time on the first call for `token`; return at once on a rerun."""
    mark = gate(token)
    if mark.exists():
        return "rerun"
    mark.touch()
    await asyncio.sleep(HOLD_S)  # on the event loop, so the lease's renewal timer keeps firing
    return "slept"


class Held(BaseModel):
    """The state of one run."""

    token: str
    result: str = ""


held = Flow(FLOW, state=Held).node("hold", Call("hold", args=lambda s: {"token": s.token}, into="result")).end("hold")
app = FlowApp(registry, [held])
