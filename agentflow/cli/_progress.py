"""What a waiting command says on stderr while it waits: which run, for what, and each change of its status.

An acting command that waits for a run to move (a worker carries it on, or this process
runs it) says so the moment it starts waiting (`Progress.waiting`: which run, and what it
waits for), then writes a line each time the run's status changes (`Progress.saw`, the
first status seen included), with the step and how long it has waited. The lines are few
(a handful per run), so they are written whether stderr is a terminal or a log.

On a terminal, a spinner line under them shows how things stand now (status, step, the
call under way, seconds waited), redrawn in place every `TICK_S` and erased before each
line and when the wait ends; written through `_text.redraw`, which escapes it as `echo`
does. stdout is never written here: what a command prints there at the end is its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

from agentflow._display import printable
from agentflow.cli._text import echo, erase_line, paint, redraw

#: The status a waiting command reports for a run parked on calls in doubt (the listing's mark).
WAITING_FOR_DECISION: Final = "waiting for a decision"
#: How often the spinner is redrawn (seconds).
TICK_S: Final = 0.1
#: The spinner's frames (plain ASCII: every terminal shows them).
FRAMES: Final = "|/-\\"


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal a spinner can redraw (not a pipe, a file, or a dumb terminal)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty is not None and isatty() and os.environ.get("TERM") != "dumb")


@dataclass
class _Run:
    """What the command has seen of one run it waits for."""

    since: float
    status: str | None = None
    step: int | None = None
    doing: str = ""


class Progress:
    """The stderr of one command that waits for runs: a line per start and per change, a spinner on a terminal."""

    def __init__(self, *, terminal: bool | None = None, tick_s: float = TICK_S) -> None:
        """Report on stderr; `terminal` None: draw a spinner when stderr is a terminal."""
        self.terminal = stderr_is_terminal() if terminal is None else terminal
        self._tick_s = tick_s
        self._runs: dict[str, _Run] = {}
        self._spinners = 0
        self._task: asyncio.Task[None] | None = None
        self._drawn = False
        self._frame = 0

    def waiting(self, run_id: str, what: str) -> None:
        """Say that the command waits for the run, and for what (once, until `done`)."""
        if run_id in self._runs:
            return
        self._runs[run_id] = _Run(time.monotonic())
        self._say(f"waiting for run {printable(run_id)}: {what}")

    def saw(self, run_id: str, status: str, step: int | None, by: str = "") -> None:
        """Note the run's status and step (`by`: who saved it); a line when the status is not the one seen last."""
        run = self._runs.get(run_id)
        if run is None:
            return
        run.step = step
        if status == run.status:
            return
        run.status = status
        saver = f" (by {printable(by)})" if by else ""
        self._say(
            f"run {printable(run_id)}: now {paint(status)} at step {step}{saver}, "
            f"after {time.monotonic() - run.since:.1f} s"
        )

    def doing(self, run_id: str, what: str) -> None:
        """What the run does now (a call under way), for the spinner; empty: nothing to say."""
        run = self._runs.get(run_id)
        if run is not None:
            run.doing = what

    def done(self, run_id: str) -> None:
        """Stop reporting the run: the command no longer waits for it."""
        self._runs.pop(run_id, None)

    @contextlib.asynccontextmanager
    async def spinning(self) -> AsyncIterator[None]:
        """Draw the spinner while inside, on a terminal (nested: until the outermost one leaves)."""
        if not self.terminal:
            yield
            return
        self._spinners += 1
        if self._task is None:
            self._task = asyncio.create_task(self._spin())
        try:
            yield
        finally:
            self._spinners -= 1
            if self._spinners == 0 and self._task is not None:
                task, self._task = self._task, None
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                self._erase()

    def _say(self, line: str) -> None:
        self._erase()
        echo(line, err=True)
        if self._task is not None:
            self._draw()

    def _erase(self) -> None:
        if self._drawn:
            erase_line()
            self._drawn = False

    async def _spin(self) -> None:
        while True:
            self._draw()
            self._frame += 1
            await asyncio.sleep(self._tick_s)

    def _draw(self) -> None:
        text = self.spinner_text()
        if text is None:
            self._erase()
            return
        redraw(f"{FRAMES[self._frame % len(FRAMES)]} {text}")
        self._drawn = True

    def spinner_text(self) -> str | None:
        """The spinner's line without its frame (None: no run to wait for yet)."""
        if not self._runs:
            return None
        waited = time.monotonic() - min(run.since for run in self._runs.values())
        if len(self._runs) == 1:
            ((run_id, run),) = self._runs.items()
            at = f" at step {run.step}" if run.step is not None else ""
            doing = f", {printable(run.doing)}" if run.doing else ""
            return f"run {printable(run_id)}: {run.status or 'waiting'}{at}{doing} ({waited:.0f} s)"
        counts = Counter(run.status or "waiting" for run in self._runs.values())
        states = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        return f"waiting for {len(self._runs)} run(s): {states} ({waited:.0f} s)"
