"""The current tool call, as seen from inside the tool, and `idempotency_key()`; the message being served."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What a running tool may know about its own call."""

    run_id: str
    """The run the call belongs to."""
    call_id: str
    """The call's deterministic identity: superstep, node, ordinal and argument digest."""
    tool: str
    """The tool's name."""
    attempt: int
    """1 for the first attempt, then 2, 3, ... on retries."""
    held: Callable[[], Awaitable[None]] | None = field(default=None, repr=False, compare=False)
    """What `confirm_held` awaits: the call log's lease check (None: the run holds no lease)."""

    @property
    def idempotency_key(self) -> str:
        """A key that is the same for this call on every worker and after every recovery."""
        return "af-" + hashlib.sha256(f"{self.run_id}\n{self.call_id}".encode()).hexdigest()[:40]

    async def confirm_held(self) -> None:
        """Make sure this call's worker still holds the run, right before an effect that must happen once.

        Before a tool starts, its worker confirms that it holds the run; a worker that stalls
        *inside* the tool (a frozen process, a long model call) may be taken over meanwhile,
        and the new holder may have the call run again on an operator's word. A tool that
        works a long while before its effect calls this right before the effect: while the
        lease is surely held it returns at once, with no round trip; else it asks the store.
        Outside a run that holds a lease (no store), it returns at once. It is a coroutine,
        for async tools: a sync tool runs on a thread of its own, where it cannot be awaited.

        Raises:
            LeaseLost: the worker no longer holds the run. Do not have the effect: let the
                error propagate, and the call stays in doubt for whoever holds the run now.
        """
        if self.held is not None:
            await self.held()


_current: ContextVar[CallInfo | None] = ContextVar("agentflow_current_call", default=None)


def current_call() -> CallInfo:
    """Return the call being run.

    Raises:
        RuntimeError: not called from inside a tool that agentflow is running.
    """
    info = _current.get()
    if info is None:
        raise RuntimeError("idempotency_key() and current_call() work only inside a tool run by agentflow")
    return info


def idempotency_key() -> str:
    """Return the current call's idempotency key, for an external API that takes one.

    The key depends only on the run id and the call's identity, so it is the same when
    the call is made again by another worker or after a recovery.

    Raises:
        RuntimeError: not called from inside a tool that agentflow is running.
    """
    return current_call().idempotency_key


_delivery: ContextVar[str | None] = ContextVar("agentflow_delivery", default=None)


@contextlib.contextmanager
def delivering(message_id: str | None) -> Iterator[None]:
    """Say which message (a Celery task id) the code in the block serves: each ``started`` record names it."""
    token = _delivery.set(message_id)
    try:
        yield
    finally:
        _delivery.reset(token)


def current_delivery() -> str | None:
    """The message the current code serves (`delivering`), or None outside one."""
    return _delivery.get()
