"""`AnthropicModel`: the Anthropic Messages API on the official ``anthropic`` SDK.

Needs the ``anthropic`` extra. As for `OpenAIChatModel`, the SDK is the transport and the
adapter reads, bounds and decodes the reply itself (see `agentflow.models._sdk`); the key
goes into a request header only, and is scrubbed from anything a server sends back.

Mapping: system messages become the request's ``system`` text (joined, in order); a tool
result becomes a ``tool_result`` block of a user turn, and consecutive messages of one
role are merged into one turn, as the API wants. Of a reply, ``text`` blocks make the
content and ``tool_use`` blocks the tool calls; other blocks (thinking, server tools) are
left out, so extended thinking, which needs its blocks sent back, is not supported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentflow.models._decode import (
    DEFAULT_MAX_REPLY_BYTES,
    DEFAULT_MAX_TOOL_CALLS,
    Malformed,
    check_tool_calls,
    text_or_none,
)
from agentflow.models._messages import Message, ToolCall
from agentflow.models._sdk import SDK, SDKModel, tool_fields

try:
    import anthropic
except ImportError as exc:  # the message names the extra, however the module is imported
    raise ImportError(
        f"AnthropicModel needs the 'anthropic' extra: pip install 'agentflow[anthropic]' ({exc})"
    ) from exc


class AnthropicModel(SDKModel):
    """A `Model` that talks to the Anthropic Messages API (``{base_url}/v1/messages``).

    Clients, retries and errors work as for `OpenAIChatModel`: an ``anthropic.AsyncAnthropic``
    per event loop unless a `client` is given; the SDK retries 408, 409, 429, 5xx (and
    Anthropic's 529 "overloaded") and connection failures; what is left raises `ModelError`.
    """

    sdk = SDK(
        client=anthropic.AsyncAnthropic,
        endpoint="messages",
        status_error=anthropic.APIStatusError,
        connection_error=anthropic.APIConnectionError,
        timeout_error=anthropic.APITimeoutError,
        omit=anthropic.Omit,
        key_headers=("Authorization", "X-Api-Key"),
        key_env="ANTHROPIC_API_KEY",
        url_env="ANTHROPIC_BASE_URL",
        default_url="https://api.anthropic.com",
        reserved=frozenset({"model", "messages", "tools", "system", "max_tokens", "stream"}),
        client_keys=("api_key", "auth_token"),
    )

    def __init__(
        self,
        model: str,
        *,
        max_tokens: int = 4096,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float | None = None,
        max_retries: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        client: anthropic.AsyncAnthropic | None = None,
        max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        """Configure the model; nothing is connected until the first call.

        Args:
            model: the model name (``claude-sonnet-4-5``, ...).
            max_tokens: the most tokens a reply may have (the API requires a bound).
            base_url: the API root, without ``/v1``. Defaults to ``$ANTHROPIC_BASE_URL``, else Anthropic's.
            api_key: sent in a request header; defaults to ``$ANTHROPIC_API_KEY``, and may be
                absent for a proxy that adds it (then no key header is sent).
            timeout_s: per-attempt timeout in seconds (60).
            max_retries: extra attempts after a retryable failure (3; 0: none).
            extra_body: more request fields (``temperature``, ``tool_choice``, ``metadata``, ...).
            client: an ``anthropic.AsyncAnthropic`` of your own (proxies, Bedrock, Vertex,
                headers). It carries its own key, URL, timeout and retries, so those arguments
                must then be left out; it is yours to close.
            max_tool_calls: the most tool calls one reply may ask for.
            max_reply_bytes: the largest reply body read, counted as it arrives.

        Raises:
            ValueError: an option is out of range, the URL is not http(s), the key holds
                whitespace or a control character, `extra_body` sets a field the adapter
                owns, or `client` comes with settings it already has.
            TypeError: `extra_body` is not JSON-able.
        """
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, not {max_tokens!r}")
        self.max_tokens = max_tokens
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            timeout_s=timeout_s,
            max_retries=max_retries,
            extra_body=extra_body,
            client=client,
            max_tool_calls=max_tool_calls,
            max_reply_bytes=max_reply_bytes,
        )

    def _request(self, messages: Sequence[Message]) -> dict[str, Any]:
        options: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": _turns(messages)}
        if system := "\n\n".join(m.content for m in messages if m.role == "system" and m.content):
            options["system"] = system
        return options

    def _wire_tool(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        return tool_fields(schema, "input_schema")

    def _parse(self, data: Any) -> Message:
        blocks = data.get("content") if isinstance(data, dict) else None
        if not isinstance(blocks, list):
            raise Malformed(f"no content list in {self._scrub.quote(json.dumps(data))}")
        uses = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
        check_tool_calls(len(uses), self.max_tool_calls)
        texts: list[str] = []
        calls: list[ToolCall] = []
        for index, block in enumerate(blocks):
            if not isinstance(block, dict):
                raise Malformed(f"content block {index} is a {type(block).__name__}, not an object")
            if block.get("type") == "text":
                texts.append(text_or_none(block.get("text"), f"text block {index}"))
            elif block.get("type") == "tool_use":
                calls.append(self._call(index, block))
        return Message.assistant("\n".join(t for t in texts if t), tool_calls=calls)

    def _call(self, index: int, block: dict[str, Any]) -> ToolCall:
        name, call_id = block.get("name"), block.get("id")
        if not isinstance(name, str) or not name:
            raise Malformed(f"tool_use block {index} has no name")
        if not isinstance(call_id, str) or not call_id:
            raise Malformed(f"tool_use block {index} to {name!r} has no id")
        return self._tool_call(call_id, name, block.get("input"))


# -- mapping ------------------------------------------------------------------------


def _turns(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation as alternating user/assistant turns of content blocks (system left out)."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return turns


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        return [{"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in message.tool_calls]
    return blocks
