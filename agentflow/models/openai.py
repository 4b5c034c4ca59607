"""`OpenAIChatModel`: the Chat Completions API over httpx (OpenAI, vLLM, Ollama, LiteLLM, ...).

Needs the ``openai`` extra (httpx). The API key goes into the ``Authorization`` header and
nowhere else: it is left out of ``repr``, and any text a server sends back is scrubbed of it
before it reaches an error message or a log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import threading
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from agentflow._errors import ModelError
from agentflow.models._messages import Message, ToolCall

logger = logging.getLogger(__name__)

#: Upper bound of one wait between attempts, whether it comes from the backoff or a `Retry-After` header.
MAX_RETRY_DELAY_S = 30.0
#: How much of a server's text an error message quotes.
_QUOTE_LIMIT = 300
#: Request fields the adapter sets itself; `extra_body` may not replace them.
_RESERVED = frozenset({"model", "messages", "tools"})


class _Malformed(ValueError):
    """A reply that does not have the Chat Completions shape (turned into a `ModelError`)."""


@dataclass(frozen=True)
class _Retryable:
    """An attempt that failed in a way worth trying again."""

    reason: str
    retry_after: float | None = None
    """Seconds the server asked us to wait, if it said."""


@dataclass
class _LoopClient:
    client: httpx.AsyncClient
    keeper: AsyncGenerator[None, None]


class OpenAIChatModel:
    """A `Model` that talks to an OpenAI-compatible ``/chat/completions`` endpoint.

    Each event loop gets its own `httpx.AsyncClient`, made on first use. ``asyncio.run`` closes
    it as it shuts the loop down, so one model can serve several ``asyncio.run`` calls in a
    row; `aclose` closes the running loop's client earlier.

    Rate limits (429), request timeouts (408), server errors (5xx), connection failures and
    timeouts are retried with exponential backoff, honouring a numeric ``Retry-After``.
    Anything else the server refuses raises `ModelError` at once, quoting its message.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        timeout_s: float = 60,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        extra_body: Mapping[str, Any] | None = None,
        client_factory: Callable[[], httpx.AsyncClient] | None = None,
    ) -> None:
        """Configure the model; nothing is connected until the first call.

        Args:
            model: the model name the server knows (``gpt-4o-mini``, ``llama3.1``, ...).
            base_url: the API root; requests go to ``{base_url}/chat/completions``.
            api_key: sent as a bearer token; defaults to ``$OPENAI_API_KEY``, and may be absent
                for local servers.
            timeout_s: per-attempt timeout in seconds.
            max_retries: extra attempts after a retryable failure (0: none).
            backoff_s: first wait between attempts; it doubles each time, up to `MAX_RETRY_DELAY_S`.
            extra_body: more request fields (``temperature``, ``max_tokens``, ``tool_choice``, ...).
            client_factory: makes the httpx client for each event loop; the model closes what it makes.

        Raises:
            ValueError: an option is out of range, the URL is not http(s), or `extra_body`
                sets a field the adapter owns.
            TypeError: `extra_body` is not JSON-able.
        """
        if not model:
            raise ValueError("OpenAIChatModel needs a model name")
        try:
            url = httpx.URL(base_url.rstrip("/"))
        except httpx.InvalidURL:
            url = httpx.URL()
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        if timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise ValueError("timeout_s must be positive, max_retries and backoff_s at least 0")
        body = dict(extra_body or {})
        if clash := sorted(_RESERVED & body.keys()):
            raise ValueError(f"extra_body may not set {clash}: the adapter sets them from its arguments")
        json.dumps(body)  # fail now, not on the first call
        self.model = model
        self.base_url = str(url)
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        self.extra_body = body
        self._api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY") or None
        self._client_factory = client_factory
        self._clients: dict[asyncio.AbstractEventLoop, _LoopClient] = {}
        self._lock = threading.Lock()  # loops on other threads may share the model

    def __repr__(self) -> str:
        return f"OpenAIChatModel(model={self.model!r}, base_url={self.base_url!r})"

    @property
    def _url(self) -> str:
        return f"{self.base_url}/chat/completions"

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        """Ask the server for the assistant's next message.

        Args:
            messages: the conversation so far.
            tools: ``Tool.schema()`` dicts (name, description, parameters); none: no ``tools`` field.

        Raises:
            ModelError: the server could not be reached or kept failing, refused the request,
                or sent a reply that is not a usable chat completion.
        """
        payload: dict[str, Any] = {**self.extra_body, "model": self.model}
        payload["messages"] = [_wire_message(m) for m in messages]
        if tools:
            payload["tools"] = [_wire_tool(t) for t in tools]
        data = await self._post(payload)
        try:
            return _parse_reply(data)
        except _Malformed as exc:
            raise self._error(f"sent a malformed reply: {exc}") from None

    async def aclose(self) -> None:
        """Close the running event loop's client (``asyncio.run`` closes it anyway at the loop's end)."""
        with self._lock:
            held = self._clients.pop(asyncio.get_running_loop(), None)
        if held is not None:
            await held.keeper.aclose()  # its finally block closes the client

    async def __aenter__(self) -> OpenAIChatModel:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- transport ------------------------------------------------------------------

    async def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            for gone in [other for other in self._clients if other.is_closed()]:
                del self._clients[gone]  # closed by hand without shutting its generators down
            held = self._clients.get(loop)
            fresh = held is None
            if held is None:
                client = self._client_factory() if self._client_factory else httpx.AsyncClient()
                held = self._clients[loop] = _LoopClient(client, _close_at_shutdown(client))
        if fresh:
            # The first step registers the generator with the loop, whose shutdown_asyncgens()
            # (asyncio.run calls it) closes the client before the loop is closed under it.
            await anext(held.keeper)
        return held.client

    async def _post(self, payload: dict[str, Any]) -> object:
        client = await self._client()
        attempts = self.max_retries + 1
        attempt = 1
        while True:
            outcome = await self._attempt(client, payload)
            if not isinstance(outcome, _Retryable):
                return outcome
            if attempt == attempts:
                raise self._error(f"failed after {attempts} attempt(s); the last one: {outcome.reason}")
            delay = min(
                MAX_RETRY_DELAY_S,
                outcome.retry_after if outcome.retry_after is not None else self.backoff_s * 2 ** (attempt - 1),
            )
            logger.warning(
                "%r: %s; retrying in %.2f s (attempt %d of %d)", self, outcome.reason, delay, attempt + 1, attempts
            )
            await asyncio.sleep(delay)
            attempt += 1

    async def _attempt(self, client: httpx.AsyncClient, payload: dict[str, Any]) -> object:
        headers = {"Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            response = await client.post(self._url, json=payload, headers=headers, timeout=self.timeout_s)
        except httpx.TimeoutException:
            return _Retryable(f"no answer within {self.timeout_s:g} s")
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            return _Retryable(self._scrub(f"connection failed ({type(exc).__name__}: {exc})"))
        except httpx.HTTPError as exc:
            raise self._error(f"was not reached: the request failed ({type(exc).__name__}: {exc})") from None
        if response.is_success:
            try:
                return response.json()
            except ValueError:
                raise self._error(f"sent a reply that is not JSON: {_quote(response.text)}") from None
        status = f"HTTP {response.status_code}: {self._scrub(_server_message(response))}"
        if response.status_code in (408, 429) or response.status_code >= 500:
            return _Retryable(status, _retry_after(response.headers))
        raise self._error(f"refused the request with {status}")

    def _scrub(self, text: str) -> str:
        return text.replace(self._api_key, "[api key]") if self._api_key else text

    def _error(self, what: str) -> ModelError:
        return ModelError(self._scrub(f"model {self.model!r} at {self._url} {what}"))


async def _close_at_shutdown(client: httpx.AsyncClient) -> AsyncGenerator[None, None]:
    """Hold `client` open until the generator is closed: by `aclose` or by its loop's shutdown."""
    try:
        yield
    finally:
        await client.aclose()


def _retry_after(headers: httpx.Headers) -> float | None:
    """The wait a 429/503 asks for: ``retry-after-ms`` (OpenAI) or a numeric ``Retry-After``."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            seconds = float(headers.get(name, "")) * scale
        except ValueError:  # absent, or an HTTP date: fall back to the backoff
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def _server_message(response: httpx.Response) -> str:
    """The error text of an OpenAI (``error.message``), vLLM (``message``) or Ollama (``error``) body."""
    try:
        body = response.json()
    except ValueError:
        return _quote(response.text) or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        for text in (
            error.get("message") if isinstance(error, dict) else error,
            body.get("message"),
            body.get("detail"),
        ):
            if isinstance(text, str) and text:
                return _quote(text)
    return _quote(response.text)


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _QUOTE_LIMIT else text[:_QUOTE_LIMIT] + "..."


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


def _wire_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": schema["name"]}
    if schema.get("description"):
        function["description"] = schema["description"]
    function["parameters"] = schema.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _parse_reply(data: object) -> Message:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        raise _Malformed(f"no choices in {_quote(json.dumps(data))}")
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        raise _Malformed("the first choice has no message object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _Malformed(f"the message content is a {type(content).__name__}, not a string")
    raw_calls = message.get("tool_calls")
    if raw_calls is not None and not isinstance(raw_calls, list):
        raise _Malformed(f"tool_calls is a {type(raw_calls).__name__}, not a list")
    calls = [_tool_call(index, raw) for index, raw in enumerate(raw_calls or [])]
    return Message.assistant(content or "", tool_calls=calls)


def _tool_call(index: int, raw: object) -> ToolCall:
    if not isinstance(raw, dict):
        raise _Malformed(f"tool call {index} is a {type(raw).__name__}, not an object")
    function = raw.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise _Malformed(f"tool call {index} has no function name")
    name: str = function["name"]
    call_id = raw.get("id")
    if call_id in (None, ""):
        call_id = f"call_{index}"  # some local servers leave ids out; the result only needs to match
    if not isinstance(call_id, str):
        raise _Malformed(f"tool call {index} to {name!r} has an id that is a {type(call_id).__name__}")
    return ToolCall(id=call_id, name=name, arguments=_arguments(name, call_id, function.get("arguments")))


def _arguments(name: str, call_id: str, raw: object) -> dict[str, Any]:
    where = f"tool call {call_id!r} to {name!r}"
    if isinstance(raw, dict):  # some servers send the object rather than its JSON text
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if not isinstance(raw, str):
        raise _Malformed(f"{where} has arguments that are a {type(raw).__name__}, not a JSON string")
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _Malformed(f"{where} has arguments that are not valid JSON ({exc.msg}): {_quote(raw)}") from None
    if not isinstance(parsed, dict):
        raise _Malformed(f"{where} has arguments that are a JSON {type(parsed).__name__}, not an object")
    return parsed
