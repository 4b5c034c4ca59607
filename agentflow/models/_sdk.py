"""What the adapters on the official SDKs share: their settings, clients per event loop, bounded reads, errors.

`SDKModel` checks the arguments (model, URL, key, limits, `extra_body`, a client of your
own), makes the SDK's client, sends the request with the tools and extra fields, and maps
every failure to a `ModelError`. An adapter describes its SDK and API as data (`SDK`: the
client class, error classes, key headers and environment variables), builds its request's
own fields (`_request`, `_wire_tool`) and maps the decoded body to a `Message` (`_parse`).
The SDK does the transport: retries with backoff (honouring ``Retry-After``), timeouts,
proxies and TLS from the environment, Azure and other providers. This class reads the body
itself, so that its size is checked while it is read and its JSON decoded strictly; and
it builds every `ModelError` from scratch, outside any ``except`` block, so that neither
the message nor the exception's chain holds what the SDK's exception held (a server's
text may echo the key).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from operator import attrgetter
from types import TracebackType
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

from agentflow._errors import ModelError
from agentflow.models._decode import Body, Malformed, arguments, check_limits, loads, read_body
from agentflow.models._messages import Message, ToolCall
from agentflow.models._secrets import Scrubber, check_key, resolve_key
from agentflow.models.usage import note_usage


@dataclass(frozen=True)
class SDK:
    """What an adapter's vendor SDK and API are, as data (both official SDKs have the same shape)."""

    client: Callable[..., Any]
    """The SDK's async client class: ``client(api_key=, base_url=, timeout=, max_retries=)``."""
    endpoint: str
    """The client's resource that sends the request (``chat.completions``: its ``with_streaming_response.create``)."""
    status_error: type[Exception]
    """What the SDK raises for a reply with an error status (after its retries)."""
    connection_error: type[Exception]
    """What it raises when the server cannot be reached."""
    timeout_error: type[Exception]
    """What it raises when the server did not answer in time (a `connection_error` too)."""
    omit: Callable[[], Any]
    """The SDK's marker that leaves a default header out of a request."""
    key_headers: tuple[str, ...]
    """The headers its client sends a key in (left out when there is no key)."""
    key_env: str
    """The environment variable of the key (``OPENAI_API_KEY``)."""
    url_env: str
    """The environment variable of the API root."""
    default_url: str
    """The vendor's API root."""
    reserved: frozenset[str]
    """Request fields the adapter sets itself; `extra_body` may not replace them."""
    client_keys: tuple[str, ...] = ("api_key",)
    """The attributes of a client of your own that may hold a credential."""
    usage_keys: tuple[str, str] = ("input_tokens", "output_tokens")
    """Where a reply's ``usage`` reports its prompt and reply tokens (`note_usage`)."""


@dataclass
class _LoopClient:
    client: Any
    keeper: AsyncGenerator[None, None]


def tool_fields(schema: Mapping[str, Any], parameters: str) -> dict[str, Any]:
    """A ``Tool.schema()`` dict's name, description (when it has one) and parameters, under the key `parameters`."""
    tool: dict[str, Any] = {"name": schema["name"]}
    if schema.get("description"):
        tool["description"] = schema["description"]
    tool[parameters] = schema.get("parameters") or {"type": "object", "properties": {}}
    return tool


def check_base_url(base_url: str) -> str:
    """`base_url` without a trailing slash, if it is an http(s) URL with a host.

    Raises:
        ValueError: it is not.
    """
    try:
        parts = urlsplit(base_url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
    return base_url.rstrip("/")


def check_extra_body(extra_body: Mapping[str, Any] | None, reserved: frozenset[str]) -> dict[str, Any]:
    """A copy of `extra_body`, checked now rather than on the first call.

    Raises:
        ValueError: it sets a field the adapter sets itself.
        TypeError: it is not JSON-able.
    """
    body = dict(extra_body or {})
    if clash := sorted(reserved & body.keys()):
        raise ValueError(f"extra_body may not set {clash}: the adapter sets them from its arguments")
    json.dumps(body)
    return body


def client_settings(client: Any, given: Mapping[str, object]) -> tuple[str, float, int]:
    """The URL, timeout (seconds) and retries of a client given to an adapter.

    Raises:
        ValueError: some of those were given to the adapter too.
    """
    if clash := [name for name, value in given.items() if value is not None]:
        raise ValueError(f"{clash} come from the client given: leave them out, or configure the client")
    timeout = client.timeout
    if not isinstance(timeout, int | float):  # an httpx Timeout: its read timeout is the one that bites
        timeout = timeout.read if isinstance(getattr(timeout, "read", None), int | float) else 60.0
    return str(client.base_url).rstrip("/"), float(timeout), int(client.max_retries)


class SDKModel:
    """Base of the adapters on an official SDK (see the module docstring)."""

    sdk: ClassVar[SDK]
    """The adapter's SDK and API."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout_s: float | None,
        max_retries: int | None,
        extra_body: Mapping[str, Any] | None,
        client: Any,
        max_tool_calls: int,
        max_reply_bytes: int,
    ) -> None:
        """Check the settings (an adapter's ``__init__`` documents them); nothing is connected.

        Raises:
            ValueError: an option is out of range, the URL is not http(s), a key holds
                whitespace or a control character, `extra_body` sets a field the adapter
                owns, or `client` comes with settings it already has.
            TypeError: `extra_body` is not JSON-able.
        """
        self.extra_body = check_extra_body(extra_body, self.sdk.reserved)
        if client is not None:
            secrets = self._client_keys(client)
            given = {"base_url": base_url, "api_key": api_key, "timeout_s": timeout_s, "max_retries": max_retries}
            base_url, timeout_s, max_retries = client_settings(client, given)
        else:
            secrets, base_url = self._own_settings(api_key, base_url)
        timeout_s = 60.0 if timeout_s is None else timeout_s
        max_retries = 3 if max_retries is None else max_retries
        if not model:
            raise ValueError(f"{type(self).__name__} needs a model name")
        if timeout_s <= 0 or max_retries < 0:
            raise ValueError("timeout_s must be positive and max_retries at least 0")
        check_limits(max_tool_calls, max_reply_bytes)
        parts = urlsplit(base_url)
        self.model = model
        self.base_url = base_url
        """Where requests go (the SDK adds the API's path)."""
        self._shown_url = parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment="").geturl()
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.max_tool_calls = max_tool_calls
        self.max_reply_bytes = max_reply_bytes
        self._api_key = secrets[0] if secrets else None
        self._scrub = Scrubber([*secrets, parts.password])
        self._given_client = client
        self._clients: dict[asyncio.AbstractEventLoop, _LoopClient] = {}
        self._lock = threading.Lock()  # loops on other threads may share the model

    def _own_settings(self, api_key: str | None, base_url: str | None) -> tuple[list[str], str]:
        """The key (`api_key`, else its environment variable's; none: no key) and the API root, checked."""
        key = resolve_key(api_key, self.sdk.key_env, type(self).__name__)
        return [key] if key else [], check_base_url(
            base_url or os.environ.get(self.sdk.url_env) or self.sdk.default_url
        )

    def _client_keys(self, client: Any) -> list[str]:
        """The credentials a client of your own holds, each checked (`check_key`)."""
        found: list[str] = []
        for name in self.sdk.client_keys:
            value = getattr(client, name, None)
            if isinstance(value, str) and value:
                check_key(value, f"the client's {name}")
                found.append(value)
        return found

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, base_url={self._shown_url!r})"

    # -- what an adapter provides --------------------------------------------------

    def _request(self, messages: Sequence[Message]) -> dict[str, Any]:
        """The request's fields of the API's own (the model, the messages, ...), tools and extra fields aside."""
        raise NotImplementedError

    def _wire_tool(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        """A ``Tool.schema()`` dict as the API declares a tool."""
        raise NotImplementedError

    def _parse(self, data: Any) -> Message:
        """The assistant message of a decoded reply body.

        Raises:
            Malformed: the body does not have the API's shape.
        """
        raise NotImplementedError

    # -- the request -------------------------------------------------------------------

    def _new_client(self) -> Any:
        """A new SDK client for the running event loop (only when no client was given)."""
        return self.sdk.client(
            api_key=self._api_key or "no-key",  # never sent: `_open` leaves the key headers out then
            base_url=self.base_url,
            timeout=self.timeout_s,
            max_retries=self.max_retries,
        )

    def _open(
        self, client: Any, messages: Sequence[Message], tools: Sequence[dict[str, Any]]
    ) -> AbstractAsyncContextManager[Body]:
        """The SDK's streamed request: the API's fields, the tools, `extra_body`, and no key header without a key."""
        options = self._request(messages)
        if tools:
            options["tools"] = [self._wire_tool(t) for t in tools]
        if self.extra_body:
            options["extra_body"] = self.extra_body
        if self._given_client is None and self._api_key is None:
            options["extra_headers"] = {header: self.sdk.omit() for header in self.sdk.key_headers}
        endpoint = attrgetter(self.sdk.endpoint)(client)
        opened: AbstractAsyncContextManager[Body] = endpoint.with_streaming_response.create(**options)
        return opened

    def _tool_call(self, call_id: str, name: str, raw_arguments: object) -> ToolCall:
        """A tool call of a reply, its arguments decoded (`arguments`)."""
        where = f"tool call {call_id!r} to {name!r}"
        return ToolCall(id=call_id, name=name, arguments=arguments(raw_arguments, where, self._scrub.quote))

    def _server_message(self, body: object) -> str | None:
        """The error text of a decoded error body, if it has one where an API or a proxy puts it.

        ``error.message`` (OpenAI, Anthropic), ``error`` (Ollama, proxies), ``message`` (vLLM), ``detail``.
        """
        if not isinstance(body, dict):
            return None
        error = body.get("error")
        for text in (
            error.get("message") if isinstance(error, dict) else error,
            body.get("message"),
            body.get("detail"),
        ):
            if isinstance(text, str) and text:
                return text
        return None

    # -- the call ----------------------------------------------------------------------

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        """Ask the server for the assistant's next message.

        Args:
            messages: the conversation so far.
            tools: ``Tool.schema()`` dicts (name, description, parameters); none: no tools field.

        Raises:
            ModelError: the server could not be reached or kept failing, refused the request,
                or sent a reply that is too large or is not a usable message.
        """
        client = await self._client()
        failure = ""
        try:
            async with self._open(client, messages, tools) as response:
                data = await read_body(response, self.max_reply_bytes)
        except Malformed as exc:
            failure = str(exc)
        except self.sdk.timeout_error as exc:
            failure = f"gave no answer within {self.timeout_s:g} s{_attempts(exc)}"
        except self.sdk.connection_error as exc:
            failure = f"could not be reached{_attempts(exc)}: {self._describe(exc.__cause__ or exc)}"
        except self.sdk.status_error as exc:
            failure = f"refused the request{_attempts(exc)} with {self._status(exc)}"
        except Exception as exc:  # reading the body can fail in the HTTP library, below the SDK
            failure = f"failed: {self._describe(exc)}"
        else:
            try:
                body = loads(data, "the body", self._scrub.quote)
                reply = self._parse(body)
                note_usage(body, *self.sdk.usage_keys)
                return reply
            except Malformed as exc:
                failure = f"sent a malformed reply: {self._scrub(str(exc))}"
            except ValueError as exc:  # a Message that does not validate (its text quotes the server's)
                failure = f"sent a malformed reply: {self._scrub.quote(str(exc))}"
        raise ModelError(self._scrub(f"model {self.model!r} at {self._shown_url} {failure}"))

    def _describe(self, exc: BaseException) -> str:
        return self._scrub.quote(f"{type(exc).__name__}: {exc}")

    def _status(self, exc: Exception) -> str:
        code = getattr(exc, "status_code", "?")
        body = getattr(exc, "body", None)
        text = body if isinstance(body, str) else self._server_message(body)
        if not text:  # a body of another shape (or none): quote it as it came
            text = _response_text(getattr(exc, "response", None))
        return f"HTTP {code}: {self._scrub.quote(text)}"

    # -- clients -----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the running event loop's client (``asyncio.run`` closes it anyway at the loop's end).

        A client given to the adapter is the caller's to close.
        """
        with self._lock:
            held = self._clients.pop(asyncio.get_running_loop(), None)
        if held is not None:
            await held.keeper.aclose()  # its finally block closes the client

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _client(self) -> Any:
        if self._given_client is not None:
            return self._given_client
        loop = asyncio.get_running_loop()
        with self._lock:
            for gone in [other for other in self._clients if other.is_closed()]:
                del self._clients[gone]  # closed by hand without shutting its generators down
            held = self._clients.get(loop)
            fresh = held is None
            if held is None:
                client = self._new_client()
                held = self._clients[loop] = _LoopClient(client, _close_at_shutdown(client))
        if fresh:
            # The first step registers the generator with the loop, whose shutdown_asyncgens()
            # (asyncio.run calls it) closes the client before the loop is closed under it.
            await anext(held.keeper)
        return held.client


def _response_text(response: Any) -> str:
    """The body of an error response as text, else its reason phrase (the body may not have been read)."""
    try:
        text = response.text
    except Exception:  # ResponseNotRead, or no response at all
        text = ""
    return text if isinstance(text, str) and text else str(getattr(response, "reason_phrase", "") or "")


def _attempts(exc: Exception) -> str:
    """`` after N attempts`` when the SDK retried (it counts retries in a request header)."""
    request = getattr(exc, "request", None)
    try:
        retries = int(request.headers.get("x-stainless-retry-count", "0"))  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        return ""
    return f" after {retries + 1} attempts" if retries else ""


async def _close_at_shutdown(client: Any) -> AsyncGenerator[None, None]:
    """Hold `client` open until the generator is closed: by `aclose` or by its loop's shutdown."""
    try:
        yield
    finally:
        await client.close()
