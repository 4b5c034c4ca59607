"""Reading a model's reply: bounded while it is read, decoded strictly, checked before the loop stores it.

Whatever a server sends, the functions here either return plain JSON values the tool loop
can sign and store (finite numbers, UTF-8-encodable strings, bounded nesting) or raise
`Malformed` with a message saying what was wrong; the adapters turn that into `ModelError`.
Nothing is raised from inside an ``except`` block, so no exception carries the server's
text (which may echo a key) in its ``__context__``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from agentflow.exec.seal import NumberRefused, strict_json

#: Default of ``max_tool_calls``: tool calls one reply may ask for.
DEFAULT_MAX_TOOL_CALLS = 64
#: Default of ``max_reply_bytes``: the size of one reply's body, counted as it is read.
DEFAULT_MAX_REPLY_BYTES = 4 * 1024 * 1024
#: How deeply a reply's JSON (tool arguments included) may nest.
MAX_DEPTH = 64
#: The longest integer a reply may hold, in digits (Python's own limit is 4,300).
MAX_INT_DIGITS = 64

Quote = Callable[[str], str]
"""Scrubs and shortens a server's text for an error message (`Scrubber.quote`)."""


class Malformed(ValueError):
    """A reply the tool loop cannot use; the message says why (and never holds a key)."""


class Body(Protocol):
    """What `read_body` needs of an SDK's streamed response."""

    @property
    def headers(self) -> Mapping[str, str]:
        """The response headers."""
        ...

    def iter_bytes(self) -> AsyncIterator[bytes]:
        """The body, decoded from its content encoding, chunk by chunk."""
        ...


def check_limits(max_tool_calls: int, max_reply_bytes: int) -> None:
    """Refuse limits that are not positive integers.

    Raises:
        ValueError: a limit is not an ``int`` of at least 1.
    """
    for name, value in (("max_tool_calls", max_tool_calls), ("max_reply_bytes", max_reply_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")


async def read_body(response: Body, limit: int) -> bytes:
    """Read a response body, stopping as soon as it is over `limit` bytes.

    Raises:
        Malformed: the body (as declared, or as read so far) is over the limit.
    """
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Malformed(_too_big(f"a reply of {int(declared)} bytes", limit))
    body = bytearray()
    async for chunk in response.iter_bytes():
        body += chunk
        if len(body) > limit:
            raise Malformed(_too_big(f"a reply of more than {limit} bytes", limit))
    return bytes(body)


def _too_big(what: str, limit: int) -> str:
    return (
        f"sent {what}, over max_reply_bytes ({limit}); the reply was not read further. "
        "Raise max_reply_bytes if replies this large are expected"
    )


def check_tool_calls(count: int, limit: int) -> None:
    """Refuse a reply asking for more tool calls than `limit`.

    Raises:
        Malformed: there are more than `limit` calls.
    """
    if count > limit:
        raise Malformed(
            f"asked for {count} tool calls in one reply, over max_tool_calls ({limit}); none of them ran. "
            "Raise max_tool_calls if a reply may ask for that many"
        )


def loads(data: bytes | str, what: str, quote: Quote) -> Any:
    """Decode JSON strictly: UTF-8 only, finite numbers, short integers, bounded nesting.

    Args:
        data: the JSON document (bytes are decoded as UTF-8, a leading BOM allowed).
        what: names the document in the error (``the reply``, ``the arguments of ...``).
        quote: scrubs and shortens the document for the error message.

    Raises:
        Malformed: the document is not such JSON.
    """
    problem = None
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            problem = f"{what}: not UTF-8 (an invalid byte at offset {exc.start})"
    if problem is None:
        assert isinstance(data, str)
        try:
            value = strict_json(data.removeprefix("\ufeff"), MAX_INT_DIGITS)
        except RecursionError:
            problem = f"{what}: JSON nested too deeply to decode"
        except NumberRefused as exc:
            problem = f"{what}: {exc}"
        except ValueError as exc:  # JSONDecodeError, whose text is ours; its .doc is the server's
            problem = f"{what}: not valid JSON ({getattr(exc, 'msg', 'undecodable')}): {quote(data)}"
        else:
            check_plain(value, what)
            return value
    raise Malformed(problem)


def check_plain(value: Any, what: str) -> None:
    """Check a decoded value the loop will store: nesting, strings, numbers.

    Walks without recursion, so a value nested too deeply is reported, not a `RecursionError`.

    Raises:
        Malformed: the value nests more than `MAX_DEPTH` levels, holds a string that is not
            UTF-8-encodable (a lone surrogate escape), or a number that is not finite.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                raise Malformed(f"{what}: a string with a lone surrogate escape (\\ud800-\\udfff), which is not text")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise Malformed(f"{what}: a number that is not finite")
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise Malformed(f"{what}: nesting deeper than {MAX_DEPTH} levels")
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def arguments(raw: object, where: str, quote: Quote) -> dict[str, Any]:
    """A tool call's arguments: an object, its JSON text, or nothing (no arguments).

    Args:
        raw: what the server sent for the arguments.
        where: names the call in errors (``tool call 'id' to 'name'``).
        quote: scrubs and shortens the server's text for the error message.

    Raises:
        Malformed: the arguments are neither, or not an object.
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        raw = loads(raw, f"the arguments of {where}", quote)
    if not isinstance(raw, dict):
        raise Malformed(f"{where} has arguments that are a JSON {_kind(raw)}, not an object")
    return raw


def text_or_none(value: object, what: str) -> str:
    """A string field the server may leave out or null; anything else is malformed.

    Raises:
        Malformed: the value is neither a string nor null.
    """
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Malformed(f"{what} is a JSON {_kind(value)}, not a string")
    return value


def _kind(value: object) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
