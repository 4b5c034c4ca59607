"""The `Model` port: what the tool loop needs from a language model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from agentflow.models._messages import Message


@runtime_checkable
class Model(Protocol):
    """A chat model that can ask for tool calls."""

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        """Return the assistant's next message for `messages`, given the `tools` it may call.

        Args:
            messages: the conversation so far.
            tools: JSON schemas of the tools (``Tool.schema()``: name, description, parameters).

        Raises:
            ModelError: the model's reply could not be used (bad JSON, an unknown shape).
        """
        ...
