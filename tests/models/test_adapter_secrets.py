"""The API key, for every adapter: refused when malformed, and never in an error, a log line or a repr.

Findings of issue 16 reproduced here: an error body longer than the quote limit was cut
before the key was scrubbed (about 25 key characters leaked into `ModelError`); a key read
with a trailing newline was sent as it was, and the HTTP library's error and DEBUG log
quoted it whole.
"""

from __future__ import annotations

import logging
import socket
from urllib.parse import quote

import openai
import pytest
from adapter_kit import KEY, QUICK_RETRY, Kind
from openai_stub import Reply, StubServer

from agentflow._errors import ModelError
from agentflow.models import Message
from agentflow.models._sdk import SDKModel
from agentflow.models._secrets import FRAGMENT, QUOTE_LIMIT, Scrubber
from agentflow.models.openai import OpenAIChatModel

HI = [Message.user("Hi")]


def fragments(text: str, key: str = KEY, size: int = 6) -> list[str]:
    """Runs of `size` or more of the key's characters found in `text` (none is the goal)."""
    return [key[i : i + size] for i in range(len(key) - size + 1) if key[i : i + size] in text]


async def failure(model: SDKModel, stub: StubServer, *replies: Reply) -> ModelError:
    stub.add(*replies)
    with pytest.raises(ModelError) as caught:
        await model.complete(HI, [])
    return caught.value


# --- keys refused at construction -------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [KEY + "\n", KEY + "\r\n", " " + KEY, KEY[:10] + "\t" + KEY[10:], KEY + "\x00", KEY + "\x7f", KEY + "\x85"]
)
def test_a_key_with_whitespace_or_control_characters_is_refused(
    kind: Kind, stub: StubServer, bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a key with a stray character, passed directly or read from the environment
    sources: list[dict[str, str | None]] = [{"api_key": bad}]
    if "\x00" not in bad:  # an environment variable cannot hold a NUL
        monkeypatch.setenv(kind.env_var, bad)
        sources.append({"api_key": None})
    for options in sources:
        # When the adapter is built, Then it refuses the key, says how to fix it, and does not show it
        with pytest.raises(ValueError, match="strip it") as caught:
            kind.make(stub, **options)
        message = str(caught.value)
        assert fragments(message) == [] and repr(bad) not in message
    assert stub.requests == []


def test_an_empty_key_is_refused_but_an_empty_environment_variable_means_none(
    kind: Kind, stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="empty"):
        kind.make(stub, api_key="")
    monkeypatch.setenv(kind.env_var, "")
    kind.make(stub, api_key=None)  # unset, as far as the adapter is concerned


def test_a_client_of_your_own_with_a_bad_key_is_refused_too(stub):
    client = openai.AsyncOpenAI(api_key=KEY + "\n", base_url=stub.base_url)
    with pytest.raises(ValueError, match="the client's api_key holds whitespace"):
        OpenAIChatModel("m", client=client)


# --- keys scrubbed from what servers send back -------------------------------------------


@pytest.mark.parametrize("padding", [0, 200, QUOTE_LIMIT - 25, QUOTE_LIMIT - 5, QUOTE_LIMIT + 50])
async def test_an_error_body_is_scrubbed_before_it_is_shortened(kind: Kind, stub: StubServer, padding: int) -> None:
    # Given an error body that echoes the key after `padding` characters (the finding: 300 - 25)
    async with kind.make(stub) as model:
        error = await failure(model, stub, kind.error(401, "x" * padding + KEY + " is not a valid key"))
    # Then no run of the key's characters is in the message, however the cut fell
    assert "HTTP 401" in str(error)
    assert fragments(str(error)) == []
    assert padding > QUOTE_LIMIT or "[api" in str(error)  # the mask, maybe cut itself


SPECIAL = 'sk-test/0123+4567=abcd~SECRET"q'


@pytest.mark.parametrize(
    "echo",
    [
        SPECIAL,
        f"Bearer {SPECIAL}",
        quote(SPECIAL, safe=""),
        SPECIAL.replace('"', '\\"'),
        SPECIAL[:20],  # a server that shows part of the key
        SPECIAL[-12:],
    ],
)
async def test_the_obvious_forms_of_the_key_are_scrubbed(kind: Kind, stub: StubServer, echo: str) -> None:
    async with kind.make(stub, api_key=SPECIAL) as model:
        error = await failure(model, stub, Reply(status=403, body=f"denied for {echo}!"))
    assert "[api key]" in str(error) and fragments(str(error), SPECIAL) == []


async def test_the_key_is_in_no_error_log_line_or_repr_at_any_level(
    kind: Kind, stub: StubServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Given DEBUG logging everywhere (the SDK, httpx2, httpcore2), and a server that echoes the key
    caplog.set_level(logging.DEBUG)
    model = kind.make(stub, max_retries=1, timeout_s=0.3)
    errors = [
        # a retried error, then a final one
        await failure(model, stub, kind.error(500, f"upstream rejected {KEY}", QUICK_RETRY), kind.error(401, KEY)),
        # a reply that is not JSON, and one that is not a message, both quoting the key
        await failure(model, stub, Reply(body=f"<html>{KEY}</html>")),
        await failure(model, stub, Reply(body={"key": KEY})),
        # tool arguments that are broken, quoting the key
        await failure(model, stub, kind.raw_arguments(f'{{"k": "{KEY}" ')),
        # a timeout (twice)
        await failure(model, stub, Reply(delay_s=2, body={}), Reply(delay_s=2, body={})),
    ]
    await model.aclose()

    # Then the key went to the server, in a header only
    assert KEY in (kind.key_sent(stub.requests[0]) or "")
    assert all(KEY not in str(seen.body) for seen in stub.requests)
    # ... and nothing we hand out or log holds any of it
    assert any(r.name.startswith("httpcore") for r in caplog.records)  # the log was on
    texts = [caplog.text, repr(model), str(model)]
    texts += [f"{e} {e.args!r} {e.__cause__!r} {e.__context__!r}" for e in errors]
    for text in texts:
        assert fragments(text) == []
    assert all(e.__cause__ is None and e.__context__ is None for e in errors)
    assert repr(model) == f"{type(model).__name__}(model='stub-model', base_url='{model.base_url}')"


async def test_the_key_is_not_in_a_connection_error(kind: Kind, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}" + ("/v1" if kind.name == "openai" else "")
    async with kind.make(None, base_url=url, max_retries=0) as model:
        with pytest.raises(ModelError, match="could not be reached") as caught:
            await model.complete(HI, [])
    assert fragments(str(caught.value)) == [] and fragments(caplog.text) == []


# --- the scrubber itself --------------------------------------------------------------------


def test_the_scrubber_masks_whole_keys_before_it_cuts_and_fragments_after():
    scrub = Scrubber([KEY, None])
    # a key that a cut at the quote limit would have split in two
    text = "y" * (QUOTE_LIMIT - 10) + KEY + " tail"
    quoted = scrub.quote(text)
    assert fragments(quoted) == [] and "[api key]" in quoted
    assert quoted.endswith("...") and len(quoted) <= QUOTE_LIMIT + 3
    # fragments of FRAGMENT characters or more, wherever they are
    assert scrub(f"a{KEY[3 : 3 + FRAGMENT]}b") == "a[api key]b"
    assert scrub(f"a{KEY[3 : 3 + FRAGMENT - 1]}b") == f"a{KEY[3 : 3 + FRAGMENT - 1]}b"
    assert Scrubber([])("nothing to hide") == "nothing to hide"


def test_credentials_in_the_base_url_are_not_shown(kind: Kind, stub: StubServer) -> None:
    # Given a base URL carrying a password and a query (a proxy's)
    url = "https://team:hunter2-proxy-pass@proxy.example:8443/llm?tenant=blue"
    model = kind.make(stub, base_url=url)
    # Then repr shows where it goes, without either, and the password would be scrubbed
    assert repr(model) == f"{type(model).__name__}(model='stub-model', base_url='https://proxy.example:8443/llm')"
    assert model._scrub("echo hunter2-proxy-pass") == "echo [api key]"
