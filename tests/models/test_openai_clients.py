"""OpenAIChatModel's SDK clients: one per event loop, closed with it; a client of your own; construction."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from adapter_kit import KEY, QUICK_RETRY
from openai_stub import StubServer, answer, error

from agentflow._errors import ModelError
from agentflow.models import Message
from agentflow.models.openai import OpenAIChatModel


def make_model(stub: StubServer, **options: Any) -> OpenAIChatModel:
    options.setdefault("api_key", KEY)
    return OpenAIChatModel("stub-model", base_url=stub.base_url, **options)


# --- clients and event loops ---------------------------------------------------------------


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[openai.AsyncOpenAI]:
    """Every SDK client the adapter makes."""
    clients: list[openai.AsyncOpenAI] = []
    new_client = OpenAIChatModel._new_client

    def recording(self: OpenAIChatModel) -> openai.AsyncOpenAI:
        clients.append(new_client(self))
        return clients[-1]

    monkeypatch.setattr(OpenAIChatModel, "_new_client", recording)
    return clients


def test_one_model_serves_several_asyncio_runs(stub, made):
    # Given one model
    model = make_model(stub)
    stub.add(answer("one"), answer("two"), answer("three"))

    async def ask_twice() -> list[str]:
        first = await model.complete([Message.user("Hi")], [])
        second = await model.complete([Message.user("Hi")], [])
        return [first.content, second.content]

    # When it is used from two asyncio.run calls in a row, without aclose
    assert asyncio.run(ask_twice()) == ["one", "two"]
    assert asyncio.run(model.complete([Message.user("Hi")], [])).content == "three"

    # Then each loop had one client, and each was closed as its loop shut down
    assert len(made) == 2
    assert all(client.is_closed() for client in made)


async def test_aclose_closes_the_loops_client_and_a_later_call_opens_another(stub, made):
    model = make_model(stub)
    stub.add(answer("a"), answer("b"))
    await model.complete([Message.user("Hi")], [])
    await model.aclose()
    assert made[0].is_closed()
    await model.complete([Message.user("Hi")], [])
    assert len(made) == 2 and not made[1].is_closed()
    await model.aclose()
    await model.aclose()  # a second close is harmless
    assert made[1].is_closed()


async def test_concurrent_calls_on_one_loop_share_one_client(stub, made):
    stub.add(*[answer(str(i)) for i in range(5)])
    async with make_model(stub) as model:
        replies = await asyncio.gather(*[model.complete([Message.user("Hi")], []) for _ in range(5)])
    assert sorted(r.content for r in replies) == ["0", "1", "2", "3", "4"]
    assert len(made) == 1


async def test_a_client_of_your_own_is_used_as_it_is_and_left_open(stub, made):
    # Given an SDK client with settings of its own (a header, no retries)
    client = openai.AsyncOpenAI(
        api_key=KEY, base_url=stub.base_url, max_retries=0, default_headers={"X-Tenant": "blue"}
    )
    stub.add(error(500, "once", QUICK_RETRY))
    model = OpenAIChatModel("stub-model", client=client)

    # When the model is asked, Then the client's settings apply (no retry) and it stays open
    with pytest.raises(ModelError, match="HTTP 500: once"):
        async with model:
            await model.complete([Message.user("Hi")], [])
    assert stub.requests[0].headers["x-tenant"] == "blue"
    assert made == [] and not client.is_closed()
    assert repr(model) == f"OpenAIChatModel(model='stub-model', base_url='{stub.base_url}')"
    await client.close()


async def test_an_azure_client_goes_to_its_deployment(stub):
    client = openai.AsyncAzureOpenAI(
        api_key=KEY, azure_endpoint=stub.root_url, api_version="2024-10-21", azure_deployment="gpt-dep", max_retries=0
    )
    stub.add(answer("from azure"))
    reply = await OpenAIChatModel("gpt-dep", client=client).complete([Message.user("Hi")], [])
    assert reply.content == "from azure"
    assert stub.requests[0].path.startswith("/openai/deployments/gpt-dep/chat/completions")
    assert stub.requests[0].headers["api-key"] == KEY
    await client.close()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"model": ""}, "model name"),
        ({"base_url": "ftp://example.org"}, "http"),
        ({"base_url": "not a url"}, "http"),
        ({"base_url": "http://host:port"}, "http"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_tool_calls": 0}, "max_tool_calls"),
        ({"max_reply_bytes": 1.5}, "max_reply_bytes"),
        ({"extra_body": {"model": "other", "temperature": 0}}, r"\['model'\]"),
        ({"extra_body": {"stream": True}}, r"\['stream'\]"),
        ({"client": openai.AsyncOpenAI(api_key="k", base_url="http://x"), "api_key": "k"}, r"\['api_key'\] come from"),
    ],
)
def test_misuse_at_construction_raises_value_error(options, error):
    options = {"model": "m", **options}
    with pytest.raises(ValueError, match=error):
        OpenAIChatModel(options.pop("model"), **options)


def test_extra_body_must_be_json_able():
    with pytest.raises(TypeError):
        OpenAIChatModel("m", api_key=KEY, extra_body={"seed": object()})
