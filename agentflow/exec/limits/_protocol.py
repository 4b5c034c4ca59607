"""The `LimitBackend` port: where the state of shared limits lives, and how a call takes a slot.

Every operation is atomic in its backend and judged on the backend's clock (Redis: the
server's ``TIME``), so workers on hosts with skewed clocks agree. A backend never waits:
`take` says how long to wait, and the caller (`gate`) does the waiting, in its own event
loop, where the run's lease goes on being renewed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from agentflow.exec.limits._spec import Limit

#: Why a call cannot start yet: every slot is held, the window is full, or a 429 closed the limit.
RefusalReason = Literal["concurrency", "rate", "closed"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refused `take`: why, and how long until it could be granted."""

    why: RefusalReason
    """What is in the way."""
    seconds: float
    """Until the window or the back-off ends; for ``concurrency``, until the oldest hold lapses (an upper bound)."""


@runtime_checkable
class LimitBackend(Protocol):
    """Keeps the state of limits: held slots, recent starts and back-offs, per limit and tenant key."""

    async def take(self, limit: Limit, key: str, token: str) -> Refusal | None:
        """Take a slot for `token` (a concurrency slot and a start in the window, at once), or say why not.

        Nothing is taken when the answer is a `Refusal`. A taken slot is held `limit.hold_s`
        unless renewed; a start counts for `limit.window_s`.
        """
        ...

    async def renew(self, limit: Limit, key: str, token: str) -> bool:
        """Hold `token`'s slot `limit.hold_s` longer; False if it lapsed (it may have been given away)."""
        ...

    async def start(self, limit: Limit, key: str, token: str) -> None:
        """Count `token`'s start from now, not from when it was granted (a start no longer counted stays gone).

        A call logged between its grant and its start (the call log writes ``started`` once
        it holds its slots) says when it really starts, so the window holds what reaches the
        provider, however long that write took.
        """
        ...

    async def release(self, limit: Limit, key: str, token: str) -> None:
        """Give `token`'s slot back (its start still counts in the window)."""
        ...

    async def close(self, limit: Limit, key: str, seconds: float) -> float:
        """Close the limit for `seconds` from now (never shortening a longer back-off); return how long it is closed."""
        ...

    async def aclose(self) -> None:
        """Close the clients this backend made in the running event loop."""
        ...
