"""What a limit is: `Limit` (concurrency, rate, tenant key, back-off).

Invariants:
- A limit bounds calls that *start*: at most `concurrency` in flight, at most `rate` starts
  in any window of `interval_s` seconds (a sliding window, not a bucket that can burst
  twice its size across a boundary), widened by `margin_s` for the jitter between a slot
  being granted and the request reaching the provider.
- Its state is shared by every process that names it with the same backend; the state of
  one limit is split by tenant key (`key`), each key with its own slots and window.
- A limit is only a description: no client, no clock, nothing made at import or declaration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentflow._identity import RunContext

#: Computes a call's tenant key from its arguments (JSON form; ``{}`` for a model call) and its run's identity.
LimitKey = Callable[[Mapping[str, Any], RunContext | None], str]


@dataclass(frozen=True, slots=True)
class Limit:
    """A limit shared by every call that names it, on every worker sharing its backend."""

    name: str = ""
    """What tools name it by (``limits=["openai"]``); a tool's own limit gets the tool's name."""
    concurrency: int | None = None
    """At most this many calls in flight at once (None: no bound)."""
    rate: int | None = None
    """At most this many calls start in any window of `interval_s` (None: no bound)."""
    interval_s: float = 1.0
    """The rate's window, in seconds."""
    margin_s: float = 0.05
    """Added to the window a start counts in: a call's request reaches its provider a little after
    its slot was granted (scheduling, the network), and not always equally late; with this margin,
    requests delayed up to that much more than others still arrive at most `rate` per `interval_s`."""
    key: LimitKey | None = None
    """The tenant key of a call: each key gets its own slots and window (None: one for all)."""
    hold_s: float = 60.0
    """A slot whose holder stops renewing it (a killed process) comes back after this long."""
    retries_429: int = 5
    """How often a call that raised `RateLimited` is tried again, after the back-off, before it fails."""
    jitter: float = 0.2
    """Each waiter of a closed limit waits up to this fraction longer, so they do not all come back at once."""
    poll_s: float = 0.02
    """How often a call waiting for a free slot looks again (a rate or back-off wait knows its end)."""

    def __post_init__(self) -> None:
        if self.concurrency is None and self.rate is None:
            raise ValueError(f"limit {self.name!r}: give a concurrency, a rate, or both")
        for field, value in (("concurrency", self.concurrency), ("rate", self.rate)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"limit {self.name!r}: {field} must be a whole number >= 1, not {value!r}")
        for field, seconds in (("interval_s", self.interval_s), ("hold_s", self.hold_s), ("poll_s", self.poll_s)):
            if not seconds > 0:
                raise ValueError(f"limit {self.name!r}: {field} must be positive, not {seconds!r}")
        if not self.margin_s >= 0:
            raise ValueError(f"limit {self.name!r}: margin_s must be >= 0, not {self.margin_s!r}")
        if self.retries_429 < 0 or not 0 <= self.jitter <= 1:
            raise ValueError(f"limit {self.name!r}: retries_429 must be >= 0 and jitter within [0, 1]")
        if "\n" in self.name:
            raise ValueError("a limit's name is one line")

    @property
    def window_s(self) -> float:
        """How long a start counts against the rate: `interval_s` plus `margin_s`."""
        return self.interval_s + self.margin_s

    def key_of(self, args: Mapping[str, Any], ctx: RunContext | None) -> str:
        """The tenant key of a call ("" when the limit has no `key`).

        Raises:
            TypeError: the key function returned something other than a str.
        """
        if self.key is None:
            return ""
        found = self.key(args, ctx)
        if not isinstance(found, str):
            raise TypeError(f"limit {self.name!r}: its key function returned {found!r}, not a str")
        return found
