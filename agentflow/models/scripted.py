"""`ScriptedModel`: replies from a list, for tests and demos (deterministic, no network)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentflow.models._messages import Message

Reply = Message | Callable[[Sequence[Message]], Message]


class ScriptedModel:
    """Answers with the next reply of its script each time it is asked.

    A reply is a `Message` or a function of the conversation so far returning one. The
    model counts its calls in `calls`; past the end of the script it raises.
    """

    def __init__(self, replies: Sequence[Reply]) -> None:
        self.replies = list(replies)
        self.calls = 0
        self.seen: list[list[Message]] = []

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        """Return the next scripted reply.

        Raises:
            IndexError: the script has no reply left.
        """
        if self.calls >= len(self.replies):
            raise IndexError(f"ScriptedModel has only {len(self.replies)} replies; it was asked for one more")
        reply = self.replies[self.calls]
        self.calls += 1
        self.seen.append(list(messages))
        return reply(messages) if callable(reply) else reply
