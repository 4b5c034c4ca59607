"""User mistakes become one line on stderr and an exit code, never a traceback.

Messages are one line with every control character escaped (`printable`): what they quote
from a store cannot reach the terminal as a control sequence.

Exit codes: 0 all is well; 1 the command ran and found something wrong (a corrupt row, a
run that could not be recovered, a run that failed); 2 the command could not do its work
(a bad argument, store URL, key or ``--app``, an unknown run or flow, an unreachable server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import IO, Any, TypeVar

import click

from agentflow._display import printable
from agentflow._errors import (
    AgentflowError,
    CheckpointConflict,
    CheckpointError,
    CheckpointNotFound,
    CheckpointStoreCorrupt,
)
from agentflow.exec.checkpoints import CheckpointStore

T = TypeVar("T")

#: The command ran and found something wrong.
FOUND_PROBLEMS = 1
#: The command could not do its work.
CANNOT = 2


class CliError(click.ClickException):
    """Raised to end a command with one line on stderr: the command could not do its work."""

    exit_code = CANNOT

    def __init__(self, message: str) -> None:
        # One line, whatever the message quotes from a store (run ids, errors) or a server.
        super().__init__(printable(" ".join(message.split())))

    def show(self, file: IO[Any] | None = None) -> None:
        """Print ``agentflow: <message>`` on stderr."""
        click.echo(f"agentflow: {self.format_message()}", err=True)


class ProblemsFound(CliError):
    """Raised to end a command that ran and found something wrong."""

    exit_code = FOUND_PROBLEMS


def raise_if_failed(run_id: str, status: str, error: str | None, *, again: bool = False) -> None:
    """The rule of the commands that move a run and wait for it: a run that ended failed is a problem found.

    ``retry`` (`again`), ``decide`` through the workers, an approving ``resume``, and ``fork``
    and ``migrate`` that carry the run on end so, with exit code 1 and the run's error, after
    they said on stdout where the run landed.

    Raises:
        ProblemsFound: `status` is ``failed``.
    """
    if status == "failed":
        raise ProblemsFound(f"run {run_id!r} failed{' again' if again else ''}: {error}")


def explain(exc: BaseException, key_env: str | None = None) -> CliError:
    """Turn an error a user can cause into a `CliError` (`key_env` names the key variable for hints)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, CheckpointStoreCorrupt) and "does not have" in text and key_env:
        return CliError(f"{text}: is ${key_env} the key the workers sign with?")
    if isinstance(exc, CheckpointStoreCorrupt) and " of run " in text:
        return ProblemsFound(f"{text} (agentflow verify names every row that fails)")
    if isinstance(exc, CheckpointNotFound | CheckpointConflict):
        return CliError(text)
    if isinstance(exc, CheckpointError):
        return CliError(text)
    if isinstance(exc, ImportError):
        return CliError(f"a module is missing: {text}")
    if isinstance(exc, OSError) and not isinstance(exc, PermissionError):
        return CliError(f"{type(exc).__name__}: {text}")
    return CliError(text)


#: Errors that come from what the user asked for or from their environment, not from a bug.
USER_ERRORS: tuple[type[BaseException], ...] = (AgentflowError, ValueError, ImportError, OSError)


def run(job: Callable[[], Awaitable[T]], key_env: str | None = None, *, close: CheckpointStore | None = None) -> T:
    """Run `job` on a new event loop, then close the store `close`; user errors become a `CliError`."""

    async def main() -> T:
        try:
            return await job()
        finally:
            if close is not None:
                await close.aclose()

    try:
        return asyncio.run(main())
    except USER_ERRORS as exc:
        raise explain(exc, key_env) from None
