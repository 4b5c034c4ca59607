"""The app the limit test's Celery workers run: one tool under a shared limit, and a flow that calls it six times.

Worker processes import it as ``limit_app:app`` (tests/limits on ``PYTHONPATH``). The limit's
state lives in the workers' Redis under the prefix ``AGENTFLOW_TEST_LIMITS`` names (read when
a process first makes a call, never at import). Each call of ``work`` appends one line,
``[start, end, pid]`` (``time.time()``), to the file ``AGENTFLOW_TEST_LIMIT_LEDGER`` names.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry
from agentflow.exec.limits import LimitBackend, RedisLimits

#: The limit under test: 3 calls in flight, 20 starts per second, on every worker together.
CONCURRENCY, PER_SECOND = 3, 20
#: How long one call of the tool takes (3 in flight could start 3 / 0.08 = 37 a second: the rate binds too).
CALL_S = 0.08


def backend() -> LimitBackend:
    """The workers' shared limits (made once per worker process, on its first limited call)."""
    return RedisLimits.from_url(os.environ["AGENTFLOW_TEST_LIMITS"])


registry = Registry(limit_backend=backend)
registry.limit("provider", concurrency=CONCURRENCY, per_second=PER_SECOND)


@registry.tool(limits=["provider"], idempotent=True)
async def work(n: int) -> int:
    """One request to the limited provider."""
    start = time.time()
    await asyncio.sleep(CALL_S)
    end = time.time()
    line = json.dumps([start, end, os.getpid()]) + "\n"
    fd = os.open(os.environ["AGENTFLOW_TEST_LIMIT_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())  # one write of a short line with O_APPEND: lines never interleave
    finally:
        os.close(fd)
    return n


#: How many calls the flow's second node makes at once through its handle.
FAN_OUT = 5


class Job(BaseModel):
    n: int = 0
    a: int = 0
    b: list[int] = []


async def many(job: Job, handle: Any) -> dict[str, Any]:
    """FAN_OUT calls at once through the node's handle."""
    return {"b": list(await asyncio.gather(*(handle.call("work", n=job.n + 1 + i) for i in range(FAN_OUT))))}


LIMITED = (
    Flow("limited", state=Job)
    .node("a", Call("work", args=lambda j: {"n": j.n}, into="a"))
    .node("b", many)
    .edge("a", "b")
    .end("b")
)

app = FlowApp(registry, [LIMITED])
