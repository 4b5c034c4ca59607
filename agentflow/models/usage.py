"""Token counts of the reply a model adapter decoded last in this context (what a model call's span shows).

An adapter notes them as it decodes a reply (`note_usage`); a tracer clears them before a
model call and reads them after it (`last_usage`), in the same task: a context variable,
so concurrent loops never see each other's. `Message` stays as it is stored.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Usage:
    """A reply's token counts, as the server reported them."""

    input_tokens: int | None
    """Tokens of the prompt (OpenAI's ``prompt_tokens``)."""
    output_tokens: int | None
    """Tokens of the reply (OpenAI's ``completion_tokens``)."""


_last: ContextVar[Usage | None] = ContextVar("agentflow_model_usage", default=None)


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def note_usage(body: Any, input_key: str, output_key: str) -> None:
    """Note the counts a decoded reply body reports under ``usage`` (nothing when it has none)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if isinstance(usage, dict):
        _last.set(Usage(_count(usage.get(input_key)), _count(usage.get(output_key))))


def clear_usage() -> None:
    """Forget the counts noted so far (before a model call)."""
    _last.set(None)


def last_usage() -> Usage | None:
    """The counts of the reply decoded last in this context (None: none noted since `clear_usage`)."""
    return _last.get()
