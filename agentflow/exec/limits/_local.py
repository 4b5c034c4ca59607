"""`LocalLimits`: the state of limits in this process, for runs on the memory store (or one process).

The same rules as the Redis backend, on this process's monotonic clock: a slot lapses
`hold_s` after its last renewal, a start counts for `window_s`, a back-off closes the
limit until a moment. Operations do not await, so each is atomic on the event loop. After
a fork the child starts with no state (the parent's holders are not its own).
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field

from agentflow.exec.limits._protocol import Refusal
from agentflow.exec.limits._spec import Limit


@dataclass
class _State:
    held: dict[str, float] = field(default_factory=dict)
    """Holder token -> when its slot lapses."""
    starts: deque[tuple[float, str]] = field(default_factory=deque)
    """Starts within the window (time, holder token), oldest first."""
    closed_until: float = 0.0


class LocalLimits:
    """Limits shared by the calls of this process only."""

    def __init__(self) -> None:
        self._states: dict[tuple[str, str], _State] = {}
        self._pid = os.getpid()

    def _state(self, limit: Limit, key: str) -> tuple[_State, float]:
        if self._pid != os.getpid():  # forked: the parent's holders are not this process's
            self._states, self._pid = {}, os.getpid()
        now = time.monotonic()
        state = self._states.setdefault((limit.name, key), _State())
        state.held = {token: ends for token, ends in state.held.items() if ends > now}
        while state.starts and state.starts[0][0] <= now - limit.window_s:
            state.starts.popleft()
        return state, now

    async def take(self, limit: Limit, key: str, token: str) -> Refusal | None:
        """See `LimitBackend.take`."""
        state, now = self._state(limit, key)
        if state.closed_until > now:
            return Refusal("closed", state.closed_until - now)
        if limit.concurrency is not None and len(state.held) >= limit.concurrency:
            return Refusal("concurrency", min(state.held.values()) - now)
        if limit.rate is not None and len(state.starts) >= limit.rate:
            return Refusal("rate", state.starts[0][0] + limit.window_s - now)
        if limit.concurrency is not None:
            state.held[token] = now + limit.hold_s
        if limit.rate is not None:
            state.starts.append((now, token))
        return None

    async def start(self, limit: Limit, key: str, token: str) -> None:
        """See `LimitBackend.start`."""
        state, now = self._state(limit, key)
        counted = [entry for entry in state.starts if entry[1] == token]
        if counted:  # now is later than every start: moved to the end, the deque stays in order
            state.starts.remove(counted[0])
            state.starts.append((now, token))

    async def renew(self, limit: Limit, key: str, token: str) -> bool:
        """See `LimitBackend.renew`."""
        state, now = self._state(limit, key)
        if token not in state.held:
            return False
        state.held[token] = now + limit.hold_s
        return True

    async def release(self, limit: Limit, key: str, token: str) -> None:
        """See `LimitBackend.release`."""
        state, _ = self._state(limit, key)
        state.held.pop(token, None)

    async def close(self, limit: Limit, key: str, seconds: float) -> float:
        """See `LimitBackend.close`."""
        state, now = self._state(limit, key)
        state.closed_until = max(state.closed_until, now + seconds)
        return state.closed_until - now

    async def aclose(self) -> None:
        """Nothing to close."""
