"""Property: for any JSON a server sends as a reply body, each adapter returns a usable assistant
`Message` or raises `ModelError`, nothing else.

Usable means what the tool loop needs to sign and store the reply: role ``assistant``, text
content, at most ``max_tool_calls`` calls, and everything canonically JSON-encodable (finite
numbers, no lone surrogates). Bodies are any JSON value, or near-misses of the API's own
shape (the right keys, mostly the right kinds of value, any value anywhere), with NaN,
infinities, huge integers and lone surrogate escapes among the leaves; a few are not JSON
at all. Real HTTP to the stub on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from adapter_kit import ANTHROPIC, KINDS, OPENAI, Kind
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_stub import Reply, StubServer

from agentflow._errors import ModelError
from agentflow.exec.seal import canonical
from agentflow.models import Message
from agentflow.models._sdk import SDKModel

LIMIT = 3


def mostly(good: st.SearchStrategy[Any], other: st.SearchStrategy[Any], odds: int = 5) -> st.SearchStrategy[Any]:
    """`good`, `odds` times for each `other`: a near-miss must get far enough to reach the hostile leaves."""
    return st.integers(0, odds).flatmap(lambda pick: other if pick == odds else good)


#: What must not reach the loop: non-finite numbers, huge integers, lone surrogates.
HOSTILE = [float("nan"), float("inf"), -float("inf"), 10**80, "\ud800", "x\udfffy"]
clean = st.text(max_size=8)
ids = st.text(min_size=1, max_size=8)
texts = mostly(clean, st.sampled_from(["\ud800", "x\udfffy"]), 3)
leaves = st.none() | st.booleans() | st.integers() | st.floats() | texts | st.sampled_from(HOSTILE)
values = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4), max_leaves=16
)


def some(items: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Lists of `items`: up to the limit, or over it."""
    return st.lists(items, max_size=LIMIT) | st.lists(items, min_size=LIMIT + 1, max_size=LIMIT + 2)


objects = mostly(
    st.dictionaries(clean, st.integers() | clean, max_size=2), st.dictionaries(texts, values, max_size=4), 10
)
names = mostly(st.just("f"), st.just("") | values, 20)
openai_calls = mostly(
    st.fixed_dictionaries(
        {
            "id": mostly(ids, values, 20),
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": names, "arguments": mostly(objects.map(json.dumps), values, 20)}
            ),
        }
    ),
    values,
)
openai_messages = st.fixed_dictionaries(
    {"content": mostly(texts, values)}, optional={"tool_calls": mostly(some(openai_calls), values)}
)
openai_bodies = st.fixed_dictionaries(
    {
        "choices": mostly(
            st.lists(mostly(st.fixed_dictionaries({"message": openai_messages}), values), min_size=1, max_size=2),
            values,
        )
    }
)
anthropic_uses = st.fixed_dictionaries(
    {"type": st.just("tool_use"), "id": mostly(ids, values, 20), "name": names, "input": mostly(objects, values, 20)}
)
anthropic_texts = st.fixed_dictionaries({"type": st.just("text"), "text": mostly(texts, values)})
anthropic_blocks = mostly(
    mostly(anthropic_uses, anthropic_texts),
    st.fixed_dictionaries({"type": st.sampled_from(["thinking", "image"]) | values}) | values,
)
anthropic_bodies = st.fixed_dictionaries({"content": mostly(some(anthropic_blocks), values)})
SHAPES = {OPENAI.name: openai_bodies, ANTHROPIC.name: anthropic_bodies}


class Served:
    """The stub, one event loop, and one model per adapter on it (kept across examples)."""

    def __init__(self) -> None:
        self.stub = StubServer().start()
        self.runner = asyncio.Runner()
        self.models: dict[str, SDKModel] = {}

    def ask(self, kind: Kind, body: Any) -> None:
        """Send `body` to `kind`'s adapter: it must come back usable, or as a ModelError."""
        model = self.models.get(kind.name) or self.models.setdefault(
            kind.name, kind.make(self.stub, max_tool_calls=LIMIT, max_retries=0)
        )
        self.stub.add(Reply(body=body))
        try:
            usable(self.runner.run(model.complete([Message.user("Hi")], [])))
        except ModelError:
            pass  # the one error allowed

    def close(self) -> None:
        self.runner.close()  # closes the models' clients as the loop shuts down
        self.stub.stop()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    served = Served()
    yield served
    served.close()


def usable(reply: Message) -> None:
    """The reply is one the tool loop can store as it is."""
    assert isinstance(reply, Message) and reply.role == "assistant"
    assert isinstance(reply.content, str) and len(reply.tool_calls) <= LIMIT
    assert all(isinstance(c.id, str) and c.name and isinstance(c.arguments, dict) for c in reply.tool_calls)
    canonical(reply.model_dump())  # raises on NaN, infinities, lone surrogates


PROPERTY = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow  # a property over many replies
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@PROPERTY
@given(data=st.data())
def test_any_near_miss_of_the_apis_shape_is_a_message_or_a_model_error(
    served: Served, kind: Kind, data: st.DataObject
) -> None:
    body = data.draw(SHAPES[kind.name])
    served.ask(kind, json.dumps(body))  # allow_nan: NaN and Infinity go out as servers send them


@pytest.mark.slow  # a property over many replies
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@PROPERTY
@given(body=values.map(json.dumps) | st.binary(max_size=64) | texts)
def test_any_json_value_or_bytes_is_a_message_or_a_model_error(served: Served, kind: Kind, body: Any) -> None:
    served.ask(kind, body)
