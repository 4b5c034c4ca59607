"""What the adapters on the official SDKs share: clients per event loop, bounded reads, errors without keys.

An adapter names its SDK's error classes (`SDKErrors`), builds the SDK client (`_new_client`),
opens the streamed request (`_open`) and maps the decoded body to a `Message` (`_parse`).
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
import threading
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

from agentflow._errors import ModelError
from agentflow.models._decode import Body, Malformed, check_limits, loads, read_body
from agentflow.models._messages import Message
from agentflow.models._secrets import Scrubber
from agentflow.models.usage import note_usage


@dataclass(frozen=True)
class SDKErrors:
    """The exception classes of one SDK (both official SDKs have the same tree)."""

    status: type[Exception]
    connection: type[Exception]
    timeout: type[Exception]


@dataclass
class _LoopClient:
    client: Any
    keeper: AsyncGenerator[None, None]


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

    errors: ClassVar[SDKErrors]
    """The SDK's exception classes."""
    usage_keys: ClassVar[tuple[str, str]] = ("input_tokens", "output_tokens")
    """Where a reply's ``usage`` reports its prompt and reply tokens (`note_usage`)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        client: Any,
        secrets: Sequence[str | None],
        timeout_s: float,
        max_retries: int,
        max_tool_calls: int,
        max_reply_bytes: int,
    ) -> None:
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
        self._scrub = Scrubber([*secrets, parts.password])
        self._given_client = client
        self._clients: dict[asyncio.AbstractEventLoop, _LoopClient] = {}
        self._lock = threading.Lock()  # loops on other threads may share the model

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, base_url={self._shown_url!r})"

    # -- what an adapter provides --------------------------------------------------

    def _new_client(self) -> Any:
        """A new SDK client for the running event loop (only when no client was given)."""
        raise NotImplementedError

    def _open(
        self, client: Any, messages: Sequence[Message], tools: Sequence[dict[str, Any]]
    ) -> AbstractAsyncContextManager[Body]:
        """The SDK's streamed request (``with_streaming_response.create(...)``)."""
        raise NotImplementedError

    def _parse(self, data: Any) -> Message:
        """The assistant message of a decoded reply body.

        Raises:
            Malformed: the body does not have the API's shape.
        """
        raise NotImplementedError

    def _server_message(self, body: object) -> str | None:
        """The error text of a decoded error body, if it has one where the API puts it."""
        raise NotImplementedError

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
        except self.errors.timeout as exc:
            failure = f"gave no answer within {self.timeout_s:g} s{_attempts(exc)}"
        except self.errors.connection as exc:
            failure = f"could not be reached{_attempts(exc)}: {self._describe(exc.__cause__ or exc)}"
        except self.errors.status as exc:
            failure = f"refused the request{_attempts(exc)} with {self._status(exc)}"
        except Exception as exc:  # reading the body can fail in the HTTP library, below the SDK
            failure = f"failed: {self._describe(exc)}"
        else:
            try:
                body = loads(data, "the body", self._scrub.quote)
                reply = self._parse(body)
                note_usage(body, *self.usage_keys)
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
