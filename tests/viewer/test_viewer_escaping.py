"""Issue 16, item 6: the viewer's pages hold up whatever strings a store holds (property-based).

For any run id, flow name, state, tool result, error, user and thread (control characters,
ANSI and OSC sequences, bidi overrides, markup, quotes, template syntax included), the run
list and the run pages render without an error, carry no tag or attribute but the
templates' own, and no raw control character (newline and tab aside: HTML whitespace).
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from html.parser import HTMLParser
from importlib.resources import files
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from markupsafe import escape
from pydantic import BaseModel
from viewer_kit import client_for, served

from agentflow import Call, Flow, FlowApp, Registry, RunContext
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.viewer import ViewerSettings, create_app
from agentflow.viewer._settings import visible

KEY = b"escaping-test-key-0123456789abcdef"
FRAGMENTS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    '" onmouseover="alert(1)',
    "' autofocus onfocus='alert(1)",
    "</pre></td></table>",
    "<!--",
    "&amp;",
    "&lt;b&gt;",
    "{{ 7*7 }}{% raw %}",
    "javascript:alert(1)",
    "\x1b[2J",
    "\x1b]0;owned\x07",
    "\x9b31m",
    "\x00",
    "\r",
    "\x7f",
    "\u202e",
    "\u2028",
    "\n",
    "\t",
    "/",
    "%2F",
    "\\",
]
#: Characters that must never reach a page raw (newline and tab may: HTML takes them as whitespace).
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")

nasty = (
    st.lists(st.one_of(st.text(max_size=6), st.sampled_from(FRAGMENTS)), min_size=1, max_size=5)
    .map("".join)
    .filter(bool)
)

registry = Registry()


@registry.tool
async def echo(value: str) -> str:
    """Give back its argument (the tool result shown)."""
    return value


@registry.tool
async def boom(value: str) -> str:
    """Fail with its argument as the message (the error shown)."""
    raise RuntimeError(value)


@registry.tool(approval=True)
async def ask(value: str) -> str:
    """Wait for approval (the pending arguments shown)."""
    return value


class Data(BaseModel):
    text: str
    result: str
    out: str = ""


def flow_of(name: str, tool: str) -> Flow[Data]:
    return Flow(name, state=Data).node("n", Call(tool, args=lambda s: {"value": s.result}, into="out")).end("n")


def template_markup() -> tuple[set[str], set[str]]:
    """Every tag and attribute name the templates write."""
    text = "".join(p.read_text() for p in files("agentflow.viewer").joinpath("templates").iterdir())
    tags = set(re.findall(r"</?([a-z][a-z0-9]*)", text))
    attrs = set(re.findall(r"\s([a-z][a-z-]*)=", text)) | {"selected", "disabled", "required", "defer"}
    return tags, attrs


TAGS, ATTRS = template_markup()


class Markup(HTMLParser):
    """Collects the tags and attribute names of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attrs: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.update(name for name, _ in attrs)

    def handle_endtag(self, tag: str) -> None:
        self.tags.add(tag)


def assert_safe(html: str) -> None:
    found = RAW.search(html)
    assert found is None, f"raw {found.group(0)!r} in the page"
    parsed = Markup()
    parsed.feed(html)
    parsed.close()
    assert parsed.tags <= TAGS, parsed.tags - TAGS
    assert parsed.attrs <= ATTRS, parsed.attrs - ATTRS
    assert html.count("<script") == 1  # the page's own viewer.js


def client_path(run_id: str) -> str:
    """`run_id` in a URL path for Starlette's TestClient, which decodes a path twice (a server, once)."""
    return quote(quote(run_id, safe=""), safe="")


def shown(value: str) -> str:
    """How a page writes `value` in text: control characters escaped, then HTML-escaped."""
    return str(escape(visible(value)))


@pytest.mark.slow  # a property over many pages
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run_id=nasty, flow=nasty, text=nasty, result=nasty, user=nasty, thread=nasty)
def test_any_stored_string_renders_escaped(run_id, flow, text, result, user, thread):
    assume(run_id not in (".", "..") and not run_id.endswith(("/.", "/..")))  # no URL can name them
    flows = [flow_of(flow, "echo"), flow_of(flow + " failing", "boom"), flow_of(flow + " paused", "ask")]
    ids = [run_id, run_id + " failing", run_id + " paused"]
    store = MemoryCheckpointStore()
    app = FlowApp(registry, flows)

    async def start() -> None:
        runner = app.runner(store, KEY)
        for each, rid in zip(flows, ids, strict=True):
            await runner.run(each, Data(text=text, result=result), run_id=rid, ctx=RunContext(user=user, thread=thread))

    asyncio.run(start())
    with client_for(create_app(ViewerSettings(store, [KEY], flows=app, label=text))) as client:
        listing = client.get("/")
        assert listing.status_code == 200
        assert_safe(listing.text)
        assert shown(run_id) in listing.text
        for rid in ids:
            page = client.get(f"/runs/{client_path(rid)}")
            assert page.status_code == 200, rid
            assert_safe(page.text)
            assert shown(rid) in page.text
    assert 'name="csrf"' in page.text  # the paused run's form, with the run id in its confirm text


def test_a_run_id_with_percent_signs_and_controls_opens_through_a_real_server():
    run_id = "%00/%2F<b>\x1b[2J\u202e"
    store = MemoryCheckpointStore()
    app = FlowApp(registry, [flow_of("f", "echo")])
    asyncio.run(app.runner(store, KEY).run(app.flows["f"], Data(text="t", result="r"), run_id=run_id))
    with served(create_app(ViewerSettings(store, [KEY]))) as base:
        listing = urllib.request.urlopen(base + "/", timeout=10).read().decode()
        (href,) = re.findall(r'<a href="(/runs/[^"]+)"', listing)
        page = urllib.request.urlopen(base + href, timeout=10).read().decode()
    assert href == "/runs/" + quote(run_id, safe="")
    assert shown(run_id) in page and "\\x1b[2J\\u202e" in page
    assert_safe(page)
