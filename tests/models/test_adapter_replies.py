"""Replies, for every adapter: each decoding failure is a `ModelError`, and the limits hold.

Findings of issue 16 reproduced here: deeply nested reply JSON raised a raw `RecursionError`;
one reply could ask for any number of tool calls (5,000 ran) and be of any size (60 MB
stored). Found on the way: a 5,000-digit integer in tool arguments raised a raw `ValueError`,
NaN went through to the tools (and was stored as null), and a lone surrogate escape went
through to the loop, which then failed to store the reply with a `UnicodeEncodeError`.
"""

from __future__ import annotations

import gzip
import json
import re
from typing import Any

import pytest
from adapter_kit import Kind
from openai_stub import Reply, StubServer

from agentflow._errors import ModelError
from agentflow.exec import Registry, recover_tool_loop, run_tool_loop
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.flow import RunStatus
from agentflow.models import Message, ToolCall
from agentflow.models._decode import DEFAULT_MAX_REPLY_BYTES, DEFAULT_MAX_TOOL_CALLS, MAX_DEPTH

HI = [Message.user("Hi")]
MiB = 1024 * 1024


async def refused(kind: Kind, stub: StubServer, reply: Reply, **options: Any) -> ModelError:
    stub.add(reply)
    async with kind.make(stub, **options) as model:
        with pytest.raises(ModelError) as caught:
            await model.complete(HI, [])
    error = caught.value
    assert error.__cause__ is None and error.__context__ is None  # nothing of the server's chained
    assert "stub-model" in str(error)
    return error


# --- decoding ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply to decode"),
        ("[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5), f"nesting deeper than {MAX_DEPTH} levels"),
        ("this is not JSON", r"not valid JSON \(Expecting value\): this is not JSON"),
        ("", r"not valid JSON"),
        (b'{"content": "\xff\xfe"}', "not UTF-8 .an invalid byte at offset 13"),
        ('{"a": 1}'.encode("utf-16"), "not UTF-8"),
        ('{"a": NaN}', "NaN, which JSON does not allow"),
        ('{"a": -Infinity}', "-Infinity, which JSON does not allow"),
        ('{"a": 1e999}', "a number too large for a float"),
        ('{"a": ' + "7" * 5000 + "}", "an integer of 5000 digits"),
        ('{"a": "\\udc00"}', "lone surrogate"),
        ("null", ""),
        ("[]", ""),
        ('"text"', ""),
        ("42", ""),
    ],
)
async def test_a_body_that_does_not_decode_raises_model_error(
    kind: Kind, stub: StubServer, body: Any, why: str
) -> None:
    error = await refused(kind, stub, Reply(body=body))
    assert "sent a malformed reply" in str(error)
    assert re.search(why, str(error))


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}", "nesting deeper than"),
        ('{"a": NaN}', "NaN"),
        ('{"a": 1e400}', "too large for a float"),
        ('{"a": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
        ('{"a": "\\ud800"}', "lone surrogate"),
        ('{"\\ud800": 1}', "lone surrogate"),
    ],
)
async def test_tool_arguments_that_do_not_decode_raise_model_error(
    kind: Kind, stub: StubServer, arguments: str, why: str
) -> None:
    error = await refused(kind, stub, kind.raw_arguments(arguments))
    assert why in str(error)
    # OpenAI's arguments are JSON text of their own, decoded per call; Anthropic's are part of the body
    assert ("the arguments of tool call 'a' to 'f'" if kind.name == "openai" else "the body") in str(error)


async def test_content_with_a_lone_surrogate_raises_model_error(kind: Kind, stub: StubServer) -> None:
    body = (
        json.dumps(kind.body([]))
        .replace('"content": null', '"content": "\\ud83d"')
        .replace('"content": []', '"content": [{"type": "text", "text": "\\ud83d"}]')
    )
    error = await refused(kind, stub, Reply(body=body))
    assert "lone surrogate" in str(error)


async def test_a_surrogate_pair_escape_and_a_bom_are_fine(kind: Kind, stub: StubServer) -> None:
    escaped = "\\ud83d\\ude00"  # one character, as a JSON escape pair
    if kind.name == "openai":  # inside the arguments' JSON text, itself a JSON string
        escaped = escaped.replace("\\", "\\\\")
    body = json.dumps(kind.body([("a", "f", {"emoji": "@@"})])).replace("@@", escaped)
    stub.add(Reply(body=b"\xef\xbb\xbf" + body.encode()))
    async with kind.make(stub) as model:
        reply = await model.complete(HI, [])
    assert reply.tool_calls == (ToolCall(id="a", name="f", arguments={"emoji": "\U0001f600"}),)


# --- limits ---------------------------------------------------------------------------------


def test_the_limits_have_sane_defaults(kind: Kind, stub: StubServer) -> None:
    model = kind.make(stub)
    assert (model.max_tool_calls, model.max_reply_bytes) == (DEFAULT_MAX_TOOL_CALLS, DEFAULT_MAX_REPLY_BYTES)
    assert (DEFAULT_MAX_TOOL_CALLS, DEFAULT_MAX_REPLY_BYTES) == (64, 4 * MiB)


async def test_too_many_tool_calls_raise_model_error_naming_the_setting(kind: Kind, stub: StubServer) -> None:
    # Given a reply asking for 5,000 calls (the finding), and one asking for 3 with a limit of 2
    many = kind.calls(*[(f"c{i}", "f", {}) for i in range(5000)])
    error = await refused(kind, stub, many)
    assert f"asked for 5000 tool calls in one reply, over max_tool_calls ({DEFAULT_MAX_TOOL_CALLS})" in str(error)
    error = await refused(kind, stub, kind.calls(*[(f"c{i}", "f", {}) for i in range(3)]), max_tool_calls=2)
    assert "over max_tool_calls (2)" in str(error) and "Raise max_tool_calls" in str(error)

    # Then exactly the limit is fine
    stub.add(kind.calls(("c0", "f", {}), ("c1", "f", {})))
    async with kind.make(stub, max_tool_calls=2) as model:
        assert len((await model.complete(HI, [])).tool_calls) == 2


async def test_a_reply_declared_over_max_reply_bytes_is_not_read(kind: Kind, stub: StubServer) -> None:
    big = kind.body([("a", "f", {"blob": "x" * (2 * MiB)})])
    error = await refused(kind, stub, Reply(body=big), max_reply_bytes=MiB)
    assert f"over max_reply_bytes ({MiB}); the reply was not read further" in str(error)
    assert "Raise max_reply_bytes" in str(error)


async def test_a_reply_without_a_length_is_cut_off_as_it_is_read(kind: Kind, stub: StubServer) -> None:
    # Given a server streaming 256 MiB with no Content-Length
    chunk = b" " * (64 * 1024)
    total = 256 * MiB
    reply = Reply(chunks=(chunk for _ in range(total // len(chunk))))
    # When the model reads it with a limit of 1 MiB, Then it stops reading early
    error = await refused(kind, stub, reply, max_reply_bytes=MiB)
    assert f"a reply of more than {MiB} bytes, over max_reply_bytes ({MiB})" in str(error)
    assert stub.sent_bytes < 64 * MiB, stub.sent_bytes  # what the sockets buffered, not the whole body


async def test_a_compressed_reply_is_limited_by_its_decoded_size(kind: Kind, stub: StubServer) -> None:
    bomb = gzip.compress(json.dumps(kind.body([("a", "f", {"blob": " " * (8 * MiB)})])).encode())
    assert len(bomb) < 64 * 1024
    reply = Reply(body=bomb, headers={"Content-Encoding": "gzip"})
    error = await refused(kind, stub, reply, max_reply_bytes=MiB)
    assert "over max_reply_bytes" in str(error)


# --- the run stays recoverable --------------------------------------------------------------


@pytest.mark.parametrize("over", ["max_tool_calls", "max_reply_bytes", "nested"])
async def test_a_refused_reply_leaves_the_run_recoverable(kind: Kind, stub: StubServer, over: str) -> None:
    # Given a registry of one tool, and a first reply over a limit (or undecodable)
    registry = Registry()
    ran: list[int] = []

    @registry.tool(idempotent=True)
    def f(n: int = 0) -> str:
        ran.append(n)
        return "ok"

    first = {
        "max_tool_calls": kind.calls(*[(f"c{i}", "f", {"n": i}) for i in range(3)]),
        "max_reply_bytes": kind.calls(("c0", "f", {"n": 0, "pad": "x" * 5000})),
        "nested": kind.raw_arguments("[" * 100_000),
    }[over]
    stub.add(first)
    store = MemoryCheckpointStore()
    async with kind.make(stub, max_tool_calls=2, max_reply_bytes=4000) as model:
        # When the loop runs, Then the ModelError propagates, and no tool ran
        with pytest.raises(ModelError):
            await run_tool_loop(model, registry, HI, run_id=f"limits-{kind.name}-{over}", checkpoints=store)
        assert ran == []

        # When the server behaves and the run is recovered, Then it finishes, each tool once
        stub.add(kind.calls(("c0", "f", {"n": 7})), kind.answer("done"))
        result = await recover_tool_loop(model, registry, f"limits-{kind.name}-{over}", checkpoints=store)
    assert result.status == RunStatus.DONE and result.text == "done"
    assert ran == [7]
    assert result.model_calls == 3  # the refused reply counts against max_steps


def test_an_error_without_a_readable_body_is_described_by_its_status(kind: Kind, stub: StubServer) -> None:
    class Unread:
        reason_phrase = "Bad Gateway"

        @property
        def text(self) -> str:
            raise RuntimeError("the body was never read")

    class StatusError(Exception):
        status_code, body, response = 502, None, Unread()

    assert kind.make(stub)._status(StatusError()) == "HTTP 502: Bad Gateway"


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"type": "x", "message": "the vendor's own"}},  # OpenAI, Anthropic
        {"error": "the vendor's own"},  # Ollama, a proxy
        {"object": "error", "message": "the vendor's own"},  # vLLM
        {"detail": "the vendor's own"},  # a proxy in front of either
    ],
)
async def test_every_adapter_quotes_the_error_text_where_an_api_or_a_proxy_puts_it(
    kind: Kind, stub: StubServer, body: dict[str, Any]
) -> None:
    # When a server refuses the request with an error body of any of these shapes, whatever the adapter
    error = await refused(kind, stub, Reply(status=400, body=body), max_retries=0)
    # Then the error quotes the text, not the body around it
    assert "HTTP 400: the vendor's own" in str(error)
