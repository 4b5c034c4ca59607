"""A scripted HTTP endpoint on 127.0.0.1, for the tests of the model adapters (real HTTP, no network).

Imported as a sibling module (``import openai_stub``): pytest's default ``prepend`` import
mode puts tests/models on ``sys.path``. Standard library only: `http.server` on a thread.

Each POST (to any path) takes the next `Reply` of the script and is recorded in
`StubServer.requests`. With the script used up the stub answers 418, which no adapter
retries, so a test that asks more often than it planned fails at once. The body builders
here are OpenAI's Chat Completions; anthropic_stub.py has the Messages API's.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable


@dataclass
class Reply:
    """One scripted answer."""

    status: int = 200
    body: Any = None
    """A JSON value, or ``str``/``bytes`` sent as they are."""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Wait this long before answering (to trigger client timeouts)."""
    chunks: Iterable[bytes] | None = None
    """Sent instead of `body`, one write each, with no Content-Length (the connection then closes)."""


@dataclass
class Seen:
    """One request the stub received."""

    path: str
    headers: dict[str, str]
    """Header names in lower case."""
    body: Any


def completion(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Chat Completions body with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "model": "stub-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
    }


def answer(text: str) -> Reply:
    """A plain assistant answer."""
    return Reply(body=completion(text))


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One tool call as the server sends it (`arguments` is JSON text, maybe broken on purpose)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def calls(*tool_calls: dict[str, Any]) -> Reply:
    """An assistant message asking for tool calls."""
    return Reply(body=completion(None, list(tool_calls)))


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    """An OpenAI-style error body."""
    body = {"error": {"message": message, "type": "stub_error", "code": None}}
    return Reply(status=status, body=body, headers=headers or {})


class StubServer:
    """The endpoint: start it, script it with `add`, read `requests`, stop it."""

    def __init__(self) -> None:
        self.script: deque[Reply] = deque()
        self.requests: list[Seen] = []
        self.sent_bytes = 0
        """Body bytes of `Reply.chunks` written before the client hung up (or all of them)."""
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._server.block_on_close = False  # keep-alive handler threads must not hold up stop()
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="openai-stub", daemon=True
        )

    @property
    def root_url(self) -> str:
        """The server's root (Anthropic's base URL: the SDK adds ``/v1/messages``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def base_url(self) -> str:
        """The API root OpenAI's SDK wants (it adds ``/chat/completions``)."""
        return f"{self.root_url}/v1"

    def add(self, *replies: Reply) -> None:
        """Append replies to the script."""
        with self._lock:
            self.script.extend(replies)

    def start(self) -> StubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers still sleeping out a delay
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next(self, seen: Seen) -> Reply:
        with self._lock:
            self.requests.append(seen)
            if self.script:
                return self.script.popleft()
        return Reply(status=418, body={"error": {"message": "the stub has no reply left"}})

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (_Handler,), {"stub": self})


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up is no error of the stub's
            super().handle_error(request, client_address)


def _payload(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
    timeout = 10  # an idle keep-alive connection's thread ends after this
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms wait for an ACK
    stub: StubServer

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {name.lower(): value for name, value in self.headers.items()}
        reply = self.stub._next(Seen(self.path, headers, body))
        if reply.delay_s and self.stub._stopping.wait(reply.delay_s):
            return
        payload = None if reply.chunks is not None else _payload(reply.body)
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            if payload is None:
                self.close_connection = True
                self.send_header("Connection", "close")
            else:
                self.send_header("Content-Length", str(len(payload)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if payload is not None:
                self.wfile.write(payload)
            for chunk in reply.chunks or ():
                self.wfile.write(chunk)
                self.stub.sent_bytes += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout, a limit): nothing more to answer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean
