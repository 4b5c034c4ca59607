"""AnthropicModel against a scripted local endpoint: the Messages API mapping, errors, clients, the loop.

What every adapter must do (keys, decoding, limits) is in test_adapter_*.py, for both adapters.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from adapter_kit import KEY, QUICK_RETRY
from anthropic_stub import answer, error, message, use, uses
from openai_stub import Reply, StubServer

from agentflow._errors import ModelError
from agentflow.exec import Registry, run_tool_loop
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.flow import RunStatus
from agentflow.models import AnthropicModel, Message, ToolCall
from agentflow.models.usage import Usage, clear_usage, last_usage


def make_model(stub: StubServer, **options: Any) -> AnthropicModel:
    options.setdefault("api_key", KEY)
    return AnthropicModel("stub-model", base_url=stub.root_url, **options)


async def test_a_plain_answer_and_the_request_shape(stub):
    # Given a server that answers with text
    stub.add(answer("Hello there."))
    async with make_model(stub, max_tokens=50, extra_body={"temperature": 0}) as model:
        # When the model is asked, with two system messages
        reply = await model.complete([Message.system("Be brief."), Message.system("Be kind."), Message.user("Hi")], [])

    # Then the reply is an assistant message; the system text went to its own field
    assert reply == Message.assistant("Hello there.")
    (seen,) = stub.requests
    assert seen.path == "/v1/messages"
    assert KEY in (seen.headers.get("x-api-key") or seen.headers["authorization"])
    assert seen.body == {
        "model": "stub-model",
        "max_tokens": 50,
        "system": "Be brief.\n\nBe kind.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "temperature": 0,
    }


async def test_a_tool_round_trip_maps_turns_blocks_and_tools(stub):
    # Given a conversation where one reply asked for two calls, and both results came back
    registry = Registry()

    @registry.tool
    def lookup(city: str) -> str:
        """Look up the weather for a city."""
        return city

    first, second = (ToolCall(id=f"toolu_{c}", name="lookup", arguments={"city": c}) for c in ("Oslo", "Rome"))
    history = [
        Message.user("Oslo and Rome?"),
        Message.assistant("Looking both up.", tool_calls=[first, second]),
        Message.tool(first, "rain"),
        Message.tool(second, "sun"),
    ]
    stub.add(Reply(body=message("Here you go:", [use("toolu_3", "lookup", {"city": "Bergen"})])))
    async with make_model(stub) as model:
        reply = await model.complete(history, registry.schemas())

    # Then the reply's text and tool_use blocks become content and calls ...
    assert reply == Message.assistant(
        "Here you go:", tool_calls=[ToolCall(id="toolu_3", name="lookup", arguments={"city": "Bergen"})]
    )
    # ... and both results went back as blocks of one user turn
    body = stub.requests[0].body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Oslo and Rome?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking both up."},
                {"type": "tool_use", "id": "toolu_Oslo", "name": "lookup", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "toolu_Rome", "name": "lookup", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_Oslo", "content": "rain"},
                {"type": "tool_result", "tool_use_id": "toolu_Rome", "content": "sun"},
            ],
        },
    ]
    assert body["tools"] == [
        {
            "name": "lookup",
            "description": "Look up the weather for a city.",
            "input_schema": registry.get("lookup").schema()["parameters"],
        }
    ]


async def test_blocks_other_than_text_and_tool_use_are_left_out(stub):
    body = message("Answer.")
    body["content"].insert(0, {"type": "thinking", "thinking": "hmm", "signature": "x"})
    stub.add(Reply(body=body))
    async with make_model(stub) as model:
        assert await model.complete([Message.user("Hi")], []) == Message.assistant("Answer.")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"type": "error"}, "no content list"),
        ({"content": "text"}, "no content list"),
        ({"content": ["text"]}, "content block 0 is a str"),
        ({"content": [{"type": "text", "text": 7}]}, "text block 0 is a JSON number"),
        ({"content": [{"type": "tool_use", "id": "t", "input": {}}]}, "tool_use block 0 has no name"),
        ({"content": [{"type": "tool_use", "name": "f", "input": {}}]}, "tool_use block 0 to 'f' has no id"),
        ({"content": [use("t1", "f", ["Oslo"])]}, "tool call 't1' to 'f' has arguments that are a JSON list"),
    ],
)
async def test_a_reply_of_the_wrong_shape_raises_model_error(stub, body, why):
    stub.add(Reply(body=body))
    async with make_model(stub) as model:
        with pytest.raises(ModelError, match=why) as caught:
            await model.complete([Message.user("Hi")], [])
    assert "stub-model" in str(caught.value) and stub.root_url in str(caught.value)


async def test_overloaded_is_retried_and_a_400_is_quoted(stub):
    stub.add(error(529, "Overloaded", QUICK_RETRY), answer("ok"), error(400, "max_tokens: too large"))
    async with make_model(stub) as model:
        assert (await model.complete([Message.user("Hi")], [])).content == "ok"
        with pytest.raises(ModelError, match="refused the request with HTTP 400: max_tokens: too large"):
            await model.complete([Message.user("Hi")], [])
    assert len(stub.requests) == 3


async def test_no_key_sends_no_key_header(stub, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    stub.add(answer("ok"))
    async with AnthropicModel("stub-model", base_url=stub.root_url) as model:
        await model.complete([Message.user("Hi")], [])
    assert "authorization" not in stub.requests[0].headers and "x-api-key" not in stub.requests[0].headers


async def test_the_key_and_url_default_to_the_environment(stub, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", stub.root_url)
    stub.add(answer("ok"))
    async with AnthropicModel("stub-model") as model:
        await model.complete([Message.user("Hi")], [])
    assert KEY in str(stub.requests[0].headers)


async def test_a_client_of_your_own_is_used_and_left_open(stub):
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url=stub.root_url, max_retries=0)
    stub.add(answer("mine"))
    async with AnthropicModel("stub-model", client=client) as model:
        assert (await model.complete([Message.user("Hi")], [])).content == "mine"
    assert not client.is_closed()
    await client.close()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"base_url": "file:///etc"}, "http"),
        ({"extra_body": {"system": "x"}}, r"\['system'\]"),
        ({"client": anthropic.AsyncAnthropic(api_key="k"), "base_url": "http://x"}, r"\['base_url'\] come from"),
    ],
)
def test_misuse_at_construction_raises_value_error(options, error):
    with pytest.raises(ValueError, match=error):
        AnthropicModel("m", **options)


async def test_the_durable_tool_loop_runs_against_the_endpoint(stub):
    registry = Registry()
    ran: list[str] = []

    @registry.tool(idempotent=True)
    def lookup(city: str) -> str:
        """Look up the weather for a city."""
        ran.append(city)
        return f"{city}: sunny"

    stub.add(uses(use("toolu_1", "lookup", {"city": "Oslo"})), answer("Oslo will be sunny."))
    async with make_model(stub) as model:
        result = await run_tool_loop(
            model, registry, [Message.user("Weather in Oslo?")], run_id="loop-anthropic-1",
            checkpoints=MemoryCheckpointStore(),
        )  # fmt: skip
    assert result.status == RunStatus.DONE and result.text == "Oslo will be sunny." and ran == ["Oslo"]
    assert stub.requests[1].body["messages"][-1] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Oslo: sunny"}],
    }


async def test_a_replys_token_counts_are_noted_for_its_span(stub):
    stub.add(Reply(body={**message("Hi."), "usage": {"input_tokens": 7, "output_tokens": 2}}))
    async with make_model(stub) as model:
        clear_usage()
        await model.complete([Message.user("Hi")], [])
    assert last_usage() == Usage(input_tokens=7, output_tokens=2)
