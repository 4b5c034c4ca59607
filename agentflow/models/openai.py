"""`OpenAIChatModel`: the Chat Completions API on the official ``openai`` SDK (OpenAI, Azure, vLLM, Ollama, ...).

Needs the ``openai`` extra. The SDK is the transport (retries, timeouts, proxies, Azure);
the adapter reads and decodes the reply itself (see `agentflow.models._sdk`). The API key
goes into the request's header and nowhere else: it is checked at construction, left out
of ``repr``, and scrubbed from any text a server sends back.
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
    import openai
except ImportError as exc:  # the message names the extra, however the module is imported
    raise ImportError(f"OpenAIChatModel needs the 'openai' extra: pip install 'agentflow[openai]' ({exc})") from exc


class OpenAIChatModel(SDKModel):
    """A `Model` that talks to an OpenAI-compatible ``/chat/completions`` endpoint.

    Unless a `client` is given, each event loop gets its own ``openai.AsyncOpenAI``, made
    on first use and closed as ``asyncio.run`` shuts the loop down (or by `aclose`), so one
    model can serve several ``asyncio.run`` calls in a row.

    The SDK retries rate limits (429), timeouts (408), conflicts (409), server errors
    (5xx) and connection failures with exponential backoff, honouring ``Retry-After``.
    Whatever still fails, is refused, or comes back unusable raises `ModelError`.
    """

    sdk = SDK(
        client=openai.AsyncOpenAI,
        endpoint="chat.completions",
        status_error=openai.APIStatusError,
        connection_error=openai.APIConnectionError,
        timeout_error=openai.APITimeoutError,
        omit=openai.Omit,
        key_headers=("Authorization",),
        key_env="OPENAI_API_KEY",
        url_env="OPENAI_BASE_URL",
        default_url="https://api.openai.com/v1",
        reserved=frozenset({"model", "messages", "tools", "stream"}),
        usage_keys=("prompt_tokens", "completion_tokens"),
    )

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float | None = None,
        max_retries: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        client: openai.AsyncOpenAI | None = None,
        max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        """Configure the model; nothing is connected until the first call.

        Args:
            model: the model (or Azure deployment) name the server knows (``gpt-4o-mini``, ...).
            base_url: the API root; requests go to ``{base_url}/chat/completions``. Defaults
                to ``$OPENAI_BASE_URL``, else OpenAI's.
            api_key: sent in the ``Authorization`` header; defaults to ``$OPENAI_API_KEY``, and
                may be absent for local servers (then no such header is sent).
            timeout_s: per-attempt timeout in seconds (60).
            max_retries: extra attempts after a retryable failure (3; 0: none).
            extra_body: more request fields (``temperature``, ``max_tokens``, ``tool_choice``, ...).
            client: an ``openai.AsyncOpenAI`` (or ``AsyncAzureOpenAI``) of your own, for settings
                the arguments above do not cover (proxies, Azure, headers). It carries its own
                key, URL, timeout and retries, so those arguments must then be left out; it is
                used on whichever event loop calls the model, and is yours to close.
            max_tool_calls: the most tool calls one reply may ask for.
            max_reply_bytes: the largest reply body read, counted as it arrives.

        Raises:
            ValueError: an option is out of range, the URL is not http(s), the key holds
                whitespace or a control character, `extra_body` sets a field the adapter
                owns, or `client` comes with settings it already has.
            TypeError: `extra_body` is not JSON-able.
        """
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
        return {"model": self.model, "messages": [_wire_message(m) for m in messages]}

    def _wire_tool(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": tool_fields(schema, "parameters")}

    def _parse(self, data: Any) -> Message:
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            raise Malformed(f"no choices in {self._scrub.quote(json.dumps(data))}")
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        if not isinstance(message, dict):
            raise Malformed("the first choice has no message object")
        content = text_or_none(message.get("content"), "the message content")
        raw_calls = message.get("tool_calls")
        if raw_calls is not None and not isinstance(raw_calls, list):
            raise Malformed(f"tool_calls is a {type(raw_calls).__name__}, not a list")
        check_tool_calls(len(raw_calls or []), self.max_tool_calls)
        calls = [self._call(index, raw) for index, raw in enumerate(raw_calls or [])]
        return Message.assistant(content, tool_calls=calls)

    def _call(self, index: int, raw: object) -> ToolCall:
        if not isinstance(raw, dict):
            raise Malformed(f"tool call {index} is a {type(raw).__name__}, not an object")
        function = raw.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise Malformed(f"tool call {index} has no function name")
        name: str = function["name"]
        call_id = raw.get("id")
        if call_id in (None, ""):
            call_id = f"call_{index}"  # some local servers leave ids out; the result only needs to match
        if not isinstance(call_id, str):
            raise Malformed(f"tool call {index} to {name!r} has an id that is a {type(call_id).__name__}")
        return self._tool_call(call_id, name, function.get("arguments"))


# -- mapping ------------------------------------------------------------------------


def _wire_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in message.tool_calls
        ]
        return {"role": "assistant", "content": message.content or None, "tool_calls": calls}
    return {"role": message.role, "content": message.content}
