"""Messages of a tool-loop conversation, and the tool calls an assistant message carries."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ToolCall(BaseModel):
    """One tool call requested by the model."""

    model_config = ConfigDict(frozen=True)

    id: str
    """The model's id for the call; the tool's result message refers to it."""
    name: str
    """The tool to call."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments, already parsed from the model's JSON."""


class Message(BaseModel):
    """One message: system, user, assistant (maybe with tool calls) or tool (a result)."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    """Calls the assistant asks for (assistant messages only)."""
    tool_call_id: str | None = None
    """The call this message answers (tool messages only)."""
    name: str | None = None
    """The tool that produced this result (tool messages only)."""

    @classmethod
    def system(cls, content: str) -> Message:
        """A system message."""
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        """A user message."""
        return cls(role="user", content=content)

    @classmethod
    def assistant(cls, content: str = "", tool_calls: tuple[ToolCall, ...] | list[ToolCall] = ()) -> Message:
        """An assistant message, maybe asking for tool calls."""
        return cls(role="assistant", content=content, tool_calls=tuple(tool_calls))

    @classmethod
    def tool(cls, call: ToolCall, content: str) -> Message:
        """The result of `call`, as the model will read it."""
        return cls(role="tool", content=content, tool_call_id=call.id, name=call.name)
