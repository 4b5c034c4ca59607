"""The adapters side by side, for the tests every adapter must pass (secrets, decoding, limits).

A `Kind` knows how to build its adapter against the stub and how its API words an answer,
tool calls and an error, so one test body runs against both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic_stub
import openai_stub
from openai_stub import Reply, Seen, StubServer

from agentflow.models._sdk import SDKModel
from agentflow.models.anthropic import AnthropicModel
from agentflow.models.openai import OpenAIChatModel

KEY = "sk-test-0123456789abcdef-SECRET"
#: Waits the stub asks for between retries (1 ms), so retry tests stay quick.
QUICK_RETRY = {"retry-after-ms": "1"}


@dataclass(frozen=True)
class Kind:
    """One adapter, as the shared tests see it."""

    name: str
    env_var: str
    make: Callable[..., SDKModel]
    """(stub, **options) -> the adapter pointed at the stub (or at ``base_url=``), with `KEY` unless told otherwise."""
    answer: Callable[[str], Reply]
    error: Callable[..., Reply]
    """(status, text, headers=None) -> an error reply in the API's shape."""
    body: Callable[[list[tuple[str, str, Any]]], dict[str, Any]]
    """[(id, name, arguments)] -> a reply body asking for those calls (arguments as the API carries them)."""

    def calls(self, *calls: tuple[str, str, Any]) -> Reply:
        return Reply(body=self.body(list(calls)))

    def raw_arguments(self, text: str) -> Reply:
        """A reply with one call to ``f`` whose arguments are the JSON text `text`, as this API carries it."""
        if self is OPENAI:
            return Reply(body=self.body([("a", "f", text)]))  # a string holding JSON
        return Reply(body=json.dumps(self.body([("a", "f", "@@")])).replace('"@@"', text))  # JSON itself

    def key_sent(self, seen: Seen) -> str | None:
        """The header value that carried the key, if any."""
        return seen.headers.get("authorization") or seen.headers.get("x-api-key")


def _openai(stub: StubServer | None, **options: Any) -> SDKModel:
    options.setdefault("api_key", KEY)
    if "base_url" not in options:
        assert stub is not None, "a stub, or a base_url"
        options["base_url"] = stub.base_url
    return OpenAIChatModel("stub-model", **options)


def _anthropic(stub: StubServer | None, **options: Any) -> SDKModel:
    options.setdefault("api_key", KEY)
    if "base_url" not in options:
        assert stub is not None, "a stub, or a base_url"
        options["base_url"] = stub.root_url
    return AnthropicModel("stub-model", **options)


def _openai_body(calls: list[tuple[str, str, Any]]) -> dict[str, Any]:
    wire = [openai_stub.call(i, n, a if isinstance(a, str) else json.dumps(a)) for i, n, a in calls]
    return openai_stub.completion(None, wire)


def _anthropic_body(calls: list[tuple[str, str, Any]]) -> dict[str, Any]:
    return anthropic_stub.message(None, [anthropic_stub.use(i, n, a) for i, n, a in calls])


OPENAI = Kind("openai", "OPENAI_API_KEY", _openai, openai_stub.answer, openai_stub.error, _openai_body)
ANTHROPIC = Kind(
    "anthropic", "ANTHROPIC_API_KEY", _anthropic, anthropic_stub.answer, anthropic_stub.error, _anthropic_body
)
KINDS = [OPENAI, ANTHROPIC]
