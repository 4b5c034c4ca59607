"""A live run whose call waits for a shared limit, on a worker thread of its own (CLI and viewer tests).

Imported as ``limit_wait_kit`` (tests/cli is on ``sys.path``; tests/viewer loads it by path,
as it does ``runs_kit``). ``with waiting_run(db, run_id) as run:`` adds a run of `POSTING`
to the store at `db` and returns once its call waits for the one slot of limit ``api``,
which another holder keeps, and that wait is in the run's event stream. Its worker holds
the run's lease (renewed) all along. On leaving the block the slot is given back and the
run finishes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _kit.poll import until
from pydantic import BaseModel

from agentflow import Call, Events, Executor, Flow, FlowRunner, Registry, RunResult
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.limits import Limit, LocalLimits
from agentflow.exec.run.events import read_events
from agentflow.exec.seal import Sealer

#: The limit the run's call waits for: one call in flight.
API = Limit("api", concurrency=1)


class Post(BaseModel):
    text: str = "hello"
    posted: str = ""


registry = Registry(limit_backend=LocalLimits())
registry.limit(API)


@registry.tool(limits=["api"])
async def post(text: str) -> str:
    """Post a message to a provider that takes one request at a time."""
    return f"posted {text}"


POSTING = Flow("posting", state=Post).node("send", Call("post", args=lambda s: {"text": s.text}, into="posted"))
POSTING = POSTING.end("send")


@dataclass
class WaitingRun:
    """The worker thread's run, and how to let it go on."""

    run_id: str
    waiting: threading.Event = field(default_factory=threading.Event)
    result: list[RunResult[Any]] = field(default_factory=list)
    error: list[BaseException] = field(default_factory=list)
    loop: asyncio.AbstractEventLoop | None = None
    free: asyncio.Event | None = None

    def let_go(self) -> None:
        """Give the other holder's slot back: the call starts and the run finishes."""
        assert self.loop is not None and self.free is not None
        self.loop.call_soon_threadsafe(self.free.set)

    async def work(self, db: Path, key: bytes) -> None:
        self.loop, self.free = asyncio.get_running_loop(), asyncio.Event()
        backend = registry.limits.backend.get()
        assert await backend.take(API, "", "another-holder") is None
        async with SQLiteCheckpointStore(db) as store:
            runner = FlowRunner(Executor(registry, events=Events(record=True)), checkpoints=store, checkpoint_key=key)
            run = asyncio.create_task(runner.run(POSTING, Post(), run_id=self.run_id))
            sealer = Sealer(key)

            async def waits() -> bool:
                assert not run.done(), run.result()
                return any(e.name == "call.waiting" for e in await read_events(store, sealer, self.run_id))

            await until(waits, "the run's call waiting for the limit, in its event stream")
            self.waiting.set()
            await self.free.wait()
            await backend.release(API, "", "another-holder")
            self.result.append(await run)


@contextmanager
def waiting_run(db: Path, run_id: str, key: bytes) -> Iterator[WaitingRun]:
    """A run of `POSTING` in `db` whose call waits for limit ``api`` while the block runs (see the module docstring)."""
    made = WaitingRun(run_id)

    def main() -> None:
        try:
            asyncio.run(made.work(db, key))
        except BaseException as exc:  # seen by the test, not lost on the thread
            made.error.append(exc)
            made.waiting.set()

    thread = threading.Thread(target=main, name=f"worker-{run_id}")
    thread.start()
    try:
        assert made.waiting.wait(30), "the run's call never waited for the limit"
        assert not made.error, made.error
        yield made
    finally:
        if made.loop is not None and made.free is not None:
            made.let_go()
        thread.join(30)
    assert not made.error, made.error
    assert [r.status for r in made.result] == ["done"]
