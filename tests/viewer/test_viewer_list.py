"""Issue 16, the run list: paged, and read from each run's latest checkpoint only.

Finding reproduced: the list read every run's full history and call log on each load and
live refresh (4 s and 1 GB of memory a load with large runs).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import runs_kit
from viewer_kit import client_for

from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.run.read import read_heads
from agentflow.exec.seal import Sealer
from agentflow.viewer import ViewerSettings, create_app

#: The kit's own runs, newest first (the demo's three orders come after them, in the order they ended).
NEWEST = ["tamper-1", "ship-1", "refund-2", "refund-1"]


class Counting:
    """A store that counts the calls made to it (and forwards them)."""

    def __init__(self, inner: SQLiteCheckpointStore) -> None:
        self.inner = inner
        self.counts: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if callable(value):
            self.counts[name] += 1
        return value


def counting_app(db: Path, **more: Any) -> tuple[Any, Counting]:
    store = Counting(SQLiteCheckpointStore(db))
    settings = ViewerSettings(store, [runs_kit.KEY], flows=runs_kit.app, **more)
    return create_app(settings), store


def listed(html: str) -> list[str]:
    return re.findall(r'<tr[^>]*data-run="([^"]+)"', html)


def test_the_list_reads_no_history_and_no_call_log(db):
    app, store = counting_app(db)
    with client_for(app) as client:
        for url in ("/", "/?status=paused", "/?flow=refunds", "/?page=2"):
            assert client.get(url).status_code == 200
        assert store.counts["history"] == 0 and store.counts["calls"] == 0
        assert store.counts["list_runs"] == 4
        # the run page, by contrast, checks everything
        client.get("/runs/order-2")
    assert store.counts["history"] >= 1 and store.counts["calls"] >= 1


def test_the_list_is_paged_newest_first(db):
    app, _ = counting_app(db, limit=3)
    whole, _ = counting_app(db)
    with client_for(whole) as client:
        everything = listed(client.get("/").text)
    with client_for(app) as client:
        first = client.get("/").text
        second = client.get("/?page=2").text
        third = client.get("/?page=3").text
        beyond = client.get("/?page=4").text
    assert everything[:4] == NEWEST and sorted(everything[4:]) == ["order-1", "order-2", "order-3"]
    assert listed(first) == everything[:3] and "runs 1–3, newest first" in first
    assert listed(second) == everything[3:6] and "runs 4–6" in second
    assert listed(third) == everything[6:] and "runs 7–7" in third
    assert listed(beyond) == [] and "no runs here" in beyond
    assert 'href="/?page=2" rel="next"' in first and 'rel="prev"' not in first
    assert 'href="/?page=1" rel="prev"' in second and 'href="/?page=3" rel="next"' in second
    assert 'rel="next"' not in third


def test_page_links_keep_the_filters_and_odd_pages_are_page_one(db):
    app, _ = counting_app(db, limit=1)
    with client_for(app) as client:
        html = client.get("/?flow=refunds&status=paused").text
        assert listed(html) == ["refund-2"]
        assert 'href="/?flow=refunds&amp;status=paused&amp;page=2" rel="next"' in html
        for odd in ("0", "-3", "x", "9" * 40):
            page = client.get(f"/?page={odd}")
            assert page.status_code == 200
        assert listed(client.get("/?page=x").text) == NEWEST[:1]


def test_the_status_filter_narrows_a_page(db):
    app, _ = counting_app(db, limit=3)
    with client_for(app) as client:
        html = client.get("/?status=paused").text
        assert listed(html) == ["refund-2"]  # refund-1 is on page 2
        assert listed(client.get("/?status=paused&page=2").text) == ["refund-1"]
        assert "No runs match these filters on this page" in client.get("/?status=failed").text


async def test_read_heads_checks_each_head_and_skips_offset(db):
    runs_kit.tamper(db, "ship-1", 1, b"Lisbon")
    async with SQLiteCheckpointStore(db) as store:
        heads = await read_heads(store, Sealer(runs_kit.KEY), None, limit=3, offset=1)
        assert [h.run_id for h in heads] == NEWEST[1:4]
        ship = heads[0]
        assert ship.corrupt and "signature does not match" in (ship.problem or "")
        assert ship.flow == "" and ship.status == "" and ship.saved_at == 0.0  # nothing unproven kept
        refund = heads[1]
        assert not refund.corrupt and refund.status == "paused" and refund.flow == "refunds" and not refund.claimed
        tickets = await read_heads(store, Sealer(runs_kit.KEY), "tickets", limit=3)
        assert [h.run_id for h in await read_heads(store, Sealer(runs_kit.KEY), "tickets", limit=1, offset=2)] == [
            tickets[2].run_id
        ]
        (order_2,) = [h for h in tickets if h.run_id == "order-2"]
        assert order_2.claimed and order_2.segment == 3
        wrong = await read_heads(store, Sealer(b"k" * 32), None, limit=10)
        assert len(wrong) == 7 and all(h.corrupt for h in wrong)
