"""OpenAIChatModel against a scripted local endpoint: mapping, retries, errors, the durable loop.

What every adapter must do (keys, decoding, limits) is in test_adapter_*.py, for both adapters.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from adapter_kit import KEY, QUICK_RETRY
from openai_stub import Reply, StubServer, answer, call, calls, completion, error

from agentflow._errors import ModelError
from agentflow.exec import Registry, recover_tool_loop, run_tool_loop
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.flow import RunStatus
from agentflow.models import Message, ToolCall
from agentflow.models.openai import OpenAIChatModel
from agentflow.models.usage import Usage, clear_usage, last_usage


def make_model(stub: StubServer, **options: Any) -> OpenAIChatModel:
    options.setdefault("api_key", KEY)
    return OpenAIChatModel("stub-model", base_url=stub.base_url, **options)


def lookup_registry() -> tuple[Registry, list[str]]:
    registry = Registry()
    ran: list[str] = []

    @registry.tool(idempotent=True)
    def lookup(city: str, days: int = 1) -> str:
        """Look up the weather forecast for a city."""
        ran.append(city)
        return f"{city}: sunny for {days} day(s)"

    return registry, ran


# --- requests and replies ---------------------------------------------------------------


async def test_a_plain_answer_comes_back_as_an_assistant_message(stub):
    # Given a server that answers with text
    stub.add(answer("Hello there."))
    model = make_model(stub)

    # When the model is asked without tools
    reply = await model.complete([Message.system("Be brief."), Message.user("Hi")], [])

    # Then the reply is an assistant message, and the request had the expected shape
    assert reply == Message.assistant("Hello there.")
    (seen,) = stub.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.body == {
        "model": "stub-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    }
    await model.aclose()


async def test_a_null_content_answer_is_an_empty_string(stub):
    stub.add(Reply(body=completion(None)))
    async with make_model(stub) as model:
        reply = await model.complete([Message.user("Hi")], [])
    assert reply.content == "" and reply.tool_calls == ()


async def test_a_tool_call_round_trip_maps_messages_and_tools(stub):
    # Given a conversation with an earlier tool call and its result, and a registry of one tool
    registry, _ = lookup_registry()
    earlier = ToolCall(id="call_1", name="lookup", arguments={"city": "Oslo"})
    history = [
        Message.system("You forecast."),
        Message.user("Weather in Oslo and Rome?"),
        Message.assistant("", tool_calls=[earlier]),
        Message.tool(earlier, "Oslo: rain"),
    ]
    stub.add(calls(call("call_2", "lookup", '{"city": "Rome", "days": 3}')))
    model = make_model(stub, extra_body={"temperature": 0})

    # When the model is asked with the registry's tools
    reply = await model.complete(history, registry.schemas())

    # Then the reply's tool call is parsed ...
    assert reply == Message.assistant(
        "", tool_calls=[ToolCall(id="call_2", name="lookup", arguments={"city": "Rome", "days": 3})]
    )
    # ... and the request carried the conversation and the tools in the wire format
    body = stub.requests[0].body
    assert body["temperature"] == 0
    assert body["messages"] == [
        {"role": "system", "content": "You forecast."},
        {"role": "user", "content": "Weather in Oslo and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Oslo: rain"},
    ]
    (tool,) = body["tools"]
    assert tool["type"] == "function"
    assert tool["function"]["name"] == "lookup"
    assert tool["function"]["description"] == "Look up the weather forecast for a city."
    assert tool["function"]["parameters"] == registry.get("lookup").schema()["parameters"]
    assert tool["function"]["parameters"]["required"] == ["city"]
    await model.aclose()


async def test_lenient_tool_call_forms_local_servers_send(stub):
    # Given a reply whose calls have an object for arguments, empty arguments, and no id
    stub.add(
        calls(
            {"id": "a", "type": "function", "function": {"name": "lookup", "arguments": {"city": "Oslo"}}},
            {"function": {"name": "ping", "arguments": ""}},
        )
    )
    async with make_model(stub) as model:
        reply = await model.complete([Message.user("go")], [])
    # Then they are accepted, and the missing id is filled in from the call's position
    assert reply.tool_calls == (
        ToolCall(id="a", name="lookup", arguments={"city": "Oslo"}),
        ToolCall(id="call_1", name="ping", arguments={}),
    )


async def test_no_key_sends_no_authorization_header(stub, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    stub.add(answer("ok"))
    async with OpenAIChatModel("stub-model", base_url=stub.base_url) as model:
        await model.complete([Message.user("Hi")], [])
    assert "authorization" not in stub.requests[0].headers


async def test_the_key_and_url_default_to_the_environment(stub, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url + "/")
    stub.add(answer("ok"))
    async with OpenAIChatModel("stub-model") as model:
        await model.complete([Message.user("Hi")], [])
    assert stub.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert stub.requests[0].path == "/v1/chat/completions"


# --- retries and transport errors (the SDK's) ------------------------------------------------


async def test_a_429_is_retried_then_succeeds(stub):
    # Given a rate limit, then an answer
    stub.add(error(429, "slow down", QUICK_RETRY), answer("done"))
    async with make_model(stub) as model:
        # When the model is asked
        reply = await model.complete([Message.user("Hi")], [])
    # Then it tried twice and returned the answer
    assert reply.content == "done"
    assert len(stub.requests) == 2


async def test_a_numeric_retry_after_is_honoured(stub):
    stub.add(error(503, "busy", {"Retry-After": "0.3"}), error(429, "busy", {"retry-after-ms": "200"}), answer("ok"))
    started = time.monotonic()
    async with make_model(stub) as model:
        await model.complete([Message.user("Hi")], [])
    assert time.monotonic() - started >= 0.5  # both waits were the server's
    assert len(stub.requests) == 3


async def test_server_errors_past_max_retries_raise_model_error(stub):
    # Given a server that fails every time
    stub.add(*[error(500, "the engine is overloaded", QUICK_RETRY)] * 3)
    async with make_model(stub, max_retries=2) as model:
        # When the model is asked, Then it gives up after max_retries + 1 attempts
        with pytest.raises(ModelError, match=r"after 3 attempts with HTTP 500: the engine is overloaded"):
            await model.complete([Message.user("Hi")], [])
    assert len(stub.requests) == 3


async def test_a_400_raises_at_once_with_the_servers_message(stub):
    stub.add(error(400, "Invalid value for 'messages[0].role'"))
    async with make_model(stub) as model:
        with pytest.raises(
            ModelError, match=r"refused the request with HTTP 400: Invalid value for 'messages\[0\].role'"
        ):
            await model.complete([Message.user("Hi")], [])
    assert len(stub.requests) == 1


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"error": "model 'x' not found"}, "model 'x' not found"),  # Ollama
        ({"object": "error", "message": "max_tokens is too large", "code": 400}, "max_tokens is too large"),  # vLLM
        ("<html>Bad Request</html>", "<html>Bad Request</html>"),
        ({"unexpected": ["shape"]}, '{"unexpected": ["shape"]}'),
    ],
)
async def test_error_bodies_of_other_servers_are_quoted(stub, body, why):
    stub.add(Reply(status=404, body=body))
    async with make_model(stub) as model:
        with pytest.raises(ModelError) as caught:
            await model.complete([Message.user("Hi")], [])
    assert f"HTTP 404: {why}" in str(caught.value)


async def test_a_timeout_is_retried_then_raises_model_error(stub):
    # Given a server slower than the timeout, twice
    stub.add(Reply(delay_s=2, body=completion("late")), Reply(delay_s=2, body=completion("late")))
    async with make_model(stub, timeout_s=0.2, max_retries=1) as model:
        # When the model is asked, Then both attempts time out and it says so
        with pytest.raises(ModelError, match=r"gave no answer within 0.2 s after 2 attempts"):
            await model.complete([Message.user("Hi")], [])
    assert len(stub.requests) == 2


async def test_a_timeout_then_an_answer_succeeds(stub):
    stub.add(Reply(delay_s=5, body=completion("late")), answer("in time"))
    async with make_model(stub, timeout_s=0.5) as model:
        assert (await model.complete([Message.user("Hi")], [])).content == "in time"


async def test_connection_refused_is_retried_then_raises_model_error():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=1) as model:
        with pytest.raises(ModelError, match=r"could not be reached after 2 attempts: ConnectError"):
            await model.complete([Message.user("Hi")], [])


# --- malformed replies of this API -------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"error": {"message": "oops"}}, "no choices"),
        ({"choices": []}, "no choices"),
        ({"choices": ["text"]}, "no message object"),
        ({"choices": [{"message": {"content": 7}}]}, "the message content is a JSON number, not a string"),
        ({"choices": [{"message": {"content": "", "tool_calls": {"id": "x"}}}]}, "tool_calls is a dict"),
        ({"choices": [{"message": {"tool_calls": [{"id": "x", "function": {}}]}}]}, "tool call 0 has no function name"),
        ({"choices": [{"message": {"tool_calls": ["call"]}}]}, "tool call 0 is a str"),
        ({"choices": [{"message": {"tool_calls": [{"id": 7, "function": {"name": "f"}}]}}]}, "has an id that is a int"),
    ],
)
async def test_a_reply_of_the_wrong_shape_raises_model_error(stub, body, why):
    stub.add(Reply(body=body))
    async with make_model(stub) as model:
        with pytest.raises(ModelError, match=why) as caught:
            await model.complete([Message.user("Hi")], [])
    message = str(caught.value)
    assert "stub-model" in message and stub.base_url in message


@pytest.mark.parametrize(
    ("arguments", "why"),
    [('{"city": "Oslo"', "not valid JSON"), ('["Oslo"]', "a JSON list, not an object"), ("42", "a JSON number")],
)
async def test_invalid_tool_arguments_name_the_tool_and_the_call(stub, arguments, why):
    stub.add(calls(call("call_ok", "lookup", '{"city": "Rome"}'), call("call_bad7", "forecast", arguments)))
    async with make_model(stub) as model:
        with pytest.raises(ModelError, match=why) as caught:
            await model.complete([Message.user("Hi")], [])
    assert "'forecast'" in str(caught.value) and "'call_bad7'" in str(caught.value)


# --- the durable tool loop ----------------------------------------------------------------


async def test_the_durable_tool_loop_runs_against_the_endpoint(stub):
    # Given a server that asks for a tool call, then answers
    registry, ran = lookup_registry()
    stub.add(calls(call("call_1", "lookup", '{"city": "Oslo"}')), answer("Oslo will be sunny."))
    async with make_model(stub) as model:
        # When the durable loop runs with a store
        result = await run_tool_loop(
            model,
            registry,
            [Message.user("Weather in Oslo?")],
            run_id="loop-openai-1",
            checkpoints=MemoryCheckpointStore(),
        )

    # Then the run is done, the tool ran once, and its result went back to the server
    assert result.status == RunStatus.DONE
    assert result.text == "Oslo will be sunny."
    assert ran == ["Oslo"]
    assert len(stub.requests) == 2
    assert stub.requests[1].body["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "Oslo: sunny for 1 day(s)",
    }
    assert stub.requests[1].body["tools"][0]["function"]["name"] == "lookup"


async def test_bad_tool_arguments_leave_the_run_recoverable(stub):
    # Given a server whose first reply has broken tool arguments
    registry, ran = lookup_registry()
    store = MemoryCheckpointStore()
    stub.add(calls(call("call_1", "lookup", '{"city": ')))
    async with make_model(stub) as model:
        # When the durable loop runs, Then the model error propagates and no tool ran
        with pytest.raises(ModelError, match=r"'call_1' to 'lookup'"):
            await run_tool_loop(
                model, registry, [Message.user("Weather in Oslo?")], run_id="loop-openai-2", checkpoints=store
            )
        assert ran == []

        # When the server behaves again and the run is recovered
        stub.add(calls(call("call_1", "lookup", '{"city": "Oslo"}')), answer("Sunny in Oslo."))
        result = await recover_tool_loop(model, registry, "loop-openai-2", checkpoints=store)

    # Then the run finishes, and the tool ran exactly once
    assert result.status == RunStatus.DONE
    assert result.text == "Sunny in Oslo."
    assert ran == ["Oslo"]
    assert len(stub.requests) == 3


async def test_a_replys_token_counts_are_noted_for_its_span(stub):
    # Given a server whose answer reports its token counts, then one that reports none
    stub.add(Reply(body={**completion("Hi."), "usage": {"prompt_tokens": 12, "completion_tokens": 3}}))
    stub.add(answer("Hi again."))
    async with make_model(stub) as model:
        # When the model is asked (after the counts were cleared, as a model call's span does)
        clear_usage()
        await model.complete([Message.user("Hi")], [])
        # Then the counts of its reply are noted, by their names in agentflow
        assert last_usage() == Usage(input_tokens=12, output_tokens=3)
        # and a reply without them notes nothing
        clear_usage()
        await model.complete([Message.user("Hi")], [])
        assert last_usage() is None
