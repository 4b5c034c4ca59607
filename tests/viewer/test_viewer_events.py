"""``GET /runs/{run_id}/events``: a run's stored events as server-sent events.

Over the kit's store (every run's events were recorded as it ran): the ids are the store's
cursors, ``Last-Event-ID`` resumes after one, a forged event is sent as a problem and
never its data, the stream follows a paused run with keep-alives without taking its lease,
and stops when the client goes or the server shuts down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import runs_kit
from _kit.poll import until
from viewer_kit import client_for, make_app, served

import agentflow
from agentflow._events import RUN_EVENT_NAMES
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.event_chain import seal_entry
from agentflow.exec.run.events import RunEvent, read_events
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer
from agentflow.viewer import _stream
from agentflow.viewer._settings import SECURITY_HEADERS

#: A secret in the data of a forged event: it must never be sent.
FORGED_SECRET = "forged-secret-do-not-send"


def frames(text: str) -> list[dict[str, str]]:
    """The events of a server-sent event stream, each as its fields (comments and ``retry`` left out)."""
    found = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
        if "event" in fields:
            found.append(fields)
    return found


def stored(db: Path, run_id: str, after: str | None = None) -> list[RunEvent]:
    async def read() -> list[RunEvent]:
        async with SQLiteCheckpointStore(db) as store:
            return await read_events(store, Sealer(runs_kit.KEY), run_id, after)

    return runs_kit.in_thread(read)


def test_a_finished_runs_stream_sends_its_events_in_cursor_order_then_end(local, db):
    events = stored(db, "order-1")
    assert events[-1].name == "run.finished"
    reply = local.get("/runs/order-1/events")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert reply.headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    sent = frames(reply.text)
    assert [f.get("id") for f in sent[:-1]] == [e.cursor for e in events]
    assert [f["event"] for f in sent[:-1]] == [e.name for e in events]
    assert sent[-1]["event"] == "end" and "id" not in sent[-1]
    first = json.loads(sent[0]["data"])
    assert first == {"name": events[0].name, "at": events[0].at, "data": events[0].data}
    assert all("\n" not in f["data"] for f in sent)


def test_last_event_id_resumes_after_that_event_repeating_none(local, db):
    cursors = [e.cursor for e in stored(db, "order-1")]
    resumed = frames(local.get("/runs/order-1/events", headers={"Last-Event-ID": cursors[4]}).text)
    assert [f.get("id") for f in resumed[:-1]] == cursors[5:]
    assert resumed[-1]["event"] == "end"
    # ?after= does the same (a link can start from a cursor); the header wins when both are given
    by_query = frames(local.get("/runs/order-1/events", params={"after": cursors[10]}).text)
    assert [f.get("id") for f in by_query[:-1]] == cursors[11:]
    both = local.get("/runs/order-1/events", params={"after": cursors[0]}, headers={"Last-Event-ID": cursors[-2]})
    assert [f.get("id") for f in frames(both.text)[:-1]] == cursors[-1:]


def test_a_forged_event_is_sent_as_a_problem_never_its_data(local, db):
    # Given order-1's stream, to which someone without the key appended an event signed with another
    # key, and then a genuine run.finished (so the stream reads on past it)
    last = stored(db, "order-1")[-1].cursor
    body = {"name": "tool.finished", "at": time.time(), "data": {"tool": FORGED_SECRET}}
    done = {"flow": "tickets", "status": "done"}
    genuine = [["run.finished", time.time(), done]]  # a later writer's first entry, a chain of its own

    async def append() -> None:
        async with SQLiteCheckpointStore(db) as store:
            forged = Sealer(b"k" * 32).seal_event("order-1", body)
            await store.append_events(
                "order-1", [forged, seal_entry(Sealer(runs_kit.KEY), "order-1", "w", 0, None, genuine)]
            )

    runs_kit.in_thread(append)
    reply = local.get("/runs/order-1/events", headers={"Last-Event-ID": last})
    problem, finished, end = frames(reply.text)
    # Then it goes out as event: problem, with its cursor and why, and nothing of its data
    assert problem["event"] == "problem" and problem["id"] != last
    assert "signature" in json.loads(problem["data"])["problem"] or "key" in json.loads(problem["data"])["problem"]
    assert FORGED_SECRET not in reply.text and "tool.finished" not in reply.text
    assert finished["event"] == "run.finished" and end["event"] == "end"


def test_a_corrupt_run_sends_its_problems_and_nothing_of_itself(local, db):
    runs_kit.tamper(db, "tamper-1", 2)
    reply = local.get("/runs/tamper-1/events")
    sent = frames(reply.text)
    assert [f["event"] for f in sent] == ["problem", "problem", "end"]
    assert "signature does not match" in sent[0]["data"]
    assert "berlin" not in reply.text.lower() and "checkpoint.saved" not in reply.text


def test_an_unknown_run_a_bad_cursor_and_an_untrusted_host_are_refused(local, db):
    assert local.get("/runs/no-such-run/events").status_code == 404
    assert local.get("/runs/order-1/events", headers={"Last-Event-ID": "not-a-cursor"}).status_code == 400
    # the page of a run whose id ends in /events is its page (the slash is encoded), not a stream
    page = local.get("/runs/order-1%2Fevents")
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    assert "order-1/events" in page.text
    with client_for(make_app(db), base_url="http://evil.example") as elsewhere:
        refused = elsewhere.get("/runs/order-1/events")
    assert refused.status_code == 400 and "event:" not in refused.text


def test_the_run_page_names_its_stream_under_the_mount_prefix(db):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    site = Starlette(routes=[Mount("/ops", app=make_app(db))])
    with client_for(site) as client:
        page = client.get("/ops/runs/a%0Ab%2Fc").text  # unknown: a problem page, no stream
        assert "data-src" not in page
        page = client.get("/ops/runs/order-1").text
        assert 'data-src="/ops/runs/order-1/events"' in page
        assert frames(client.get("/ops/runs/order-1/events").text)[-1]["event"] == "end"


def test_the_page_listens_for_every_event_name_agentflow_records():
    sources = Path(agentflow.__file__).parent.rglob("*.py")
    emitted = {
        name
        for path in sources
        for name in re.findall(r"""(?:emit|Event|ending_event)\(\s*["']([a-z_]+\.[a-z_]+)["']""", path.read_text())
        if name != "runs.swept"  # no run id: never in a run's stream
    }
    assert emitted == set(RUN_EVENT_NAMES), emitted ^ set(RUN_EVENT_NAMES)


async def test_a_paused_run_is_followed_with_keep_alives_until_the_client_goes(db, monkeypatch, caplog):
    # Given refund-1, paused (it has not ended: its stream stays open), and a keep-alive every 0.1 s
    monkeypatch.setattr(_stream, "KEEPALIVE_S", 0.1)
    caplog.set_level(logging.DEBUG, logger="agentflow.viewer")
    cursors = [e.cursor for e in stored(db, "refund-1")]
    with served(make_app(db)) as base:
        async with httpx.AsyncClient(base_url=base) as client:
            async with client.stream("GET", "/runs/refund-1/events") as reply:
                lines = reply.aiter_lines()
                seen: list[str] = []
                while ": keep-alive" not in seen:
                    seen.append(await asyncio.wait_for(anext(lines), 5))
                # Then every stored event came, then a keep-alive, and the run is not held by the viewer
                assert [line.removeprefix("id: ") for line in seen if line.startswith("id: ")] == cursors
                assert "event: end" not in seen
                assert (await _report(db, "refund-1")).lease is None
        # When the client goes, the stream stops
        await until(lambda: "closed: the client went away" in caplog.text, "the stream to close")


async def test_the_server_ends_open_streams_when_it_shuts_down(db):
    started = 0.0
    seen: list[str] = []
    with served(make_app(db)) as base:
        client = httpx.AsyncClient(base_url=base)
        reply = await client.send(client.build_request("GET", "/runs/refund-1/events"), stream=True)
        lines = reply.aiter_lines()
        while "event: run.paused" not in seen:
            seen.append(await asyncio.wait_for(anext(lines), 5))
        started = time.monotonic()
        # leaving the block shuts the server down while the stream is open
    assert time.monotonic() - started < 5
    rest = [line async for line in lines]
    await reply.aclose()
    await client.aclose()
    assert "event: end" not in rest  # broken off, not ended: a browser reconnects to the next viewer


async def _report(db: Path, run_id: str) -> Any:
    async with SQLiteCheckpointStore(db) as store:
        return await read_run(store, Sealer(runs_kit.KEY), run_id)


def test_a_copy_appended_after_last_event_id_is_sent_as_a_problem_on_reconnect(local, db):
    # Given order-1's finished stream, and a byte copy of the entry holding its charge_card's tool.finished
    # appended after its last entry (XADD or INSERT: no key needed)
    every = stored(db, "order-1")
    charged = next(e for e in every if e.name == "tool.finished" and e.data.get("tool") == "charge_card")
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "INSERT INTO events (run_id, payload, kid, sig) SELECT run_id, payload, kid, sig FROM events WHERE id = ?",
            (int(charged.cursor.split("~")[1] if "~" in charged.cursor else charged.cursor),),
        )
    # When a browser reconnects after the last genuine event
    sent = frames(local.get("/runs/order-1/events", headers={"Last-Event-ID": every[-1].cursor}).text)
    # Then the copy goes out as problems, a replay, never as a second tool.finished, and the stream ends
    assert sent[-1]["event"] == "end" and {f["event"] for f in sent[:-1]} == {"problem"}
    assert all("a copy of an event already read" in json.loads(f["data"])["problem"] for f in sent[:-1])
