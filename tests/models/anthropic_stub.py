"""Anthropic Messages API bodies for the stub endpoint of openai_stub.py (the same server)."""

from __future__ import annotations

from typing import Any

from openai_stub import Reply


def message(text: str | None = None, uses: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Messages API reply: a text block (if any) and tool_use blocks."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text is not None else []
    content += uses or []
    return {
        "id": "msg_stub",
        "type": "message",
        "role": "assistant",
        "model": "stub-model",
        "content": content,
        "stop_reason": "tool_use" if uses else "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def use(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """One tool_use block (`arguments` is the input object, or anything, broken on purpose)."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def answer(text: str) -> Reply:
    """A plain assistant answer."""
    return Reply(body=message(text))


def uses(*blocks: dict[str, Any]) -> Reply:
    """An assistant message asking for tool calls."""
    return Reply(body=message(None, list(blocks)))


def error(status: int, text: str, headers: dict[str, str] | None = None) -> Reply:
    """An Anthropic-style error body."""
    body = {"type": "error", "error": {"type": "stub_error", "message": text}}
    return Reply(status=status, body=body, headers=headers or {})
