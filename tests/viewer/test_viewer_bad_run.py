"""Issue 15, item 7: a run signed with another key does not hide the good ones in the viewer.

The list shows every good run as usual and flags the bad one with the key id its row
carries; it never says that no run checks while some do.
"""

from __future__ import annotations

import re

from viewer_kit import client_for, make_app, runs_kit

from agentflow.exec.seal import key_id

OTHER_KEY = runs_kit.ALIEN_KEY
GOOD = ["order-1", "order-2", "order-3", "refund-1", "refund-2", "ship-1", "tamper-1"]
add_alien = runs_kit.add_alien


def words(html: str) -> str:
    """The page with every run of whitespace as one space (the templates wrap their sentences)."""
    return " ".join(html.split())


def row_of(html: str, run_id: str) -> str:
    found = re.search(rf'<tr[^>]*data-run="{re.escape(run_id)}".*?</tr>', html, re.S)
    assert found, f"no row for {run_id}"
    return found.group(0)


def test_the_list_shows_the_good_runs_and_flags_the_one_signed_with_another_key(db):
    # Given the kit's runs and one run signed with another key
    add_alien(db)
    # When the list is opened
    with client_for(make_app(db)) as client:
        html = client.get("/").text
    # Then every good run is listed as usual, with its flow and status
    for run_id in GOOD:
        assert "row-corrupt" not in row_of(html, run_id)
    assert 'class="status paused">paused' in row_of(html, "refund-1")
    # And the bad one is flagged with the key id its row carries, and nothing read from it
    alien = row_of(html, "alien-1")
    assert 'class="pill other-key">other key' in alien and 'class="pill corrupt">corrupt' in alien
    assert f"signed with key id {key_id(OTHER_KEY)}, which this viewer does not hold" in alien
    assert "Oslo" not in html and "shipping" not in alien
    # And the banner counts it, names both key ids for what they are, and never says that no run checks
    assert "1 run is signed with a key this viewer does not hold" in words(html)
    assert f"key id {key_id(OTHER_KEY)}; the viewer holds key id {key_id(runs_kit.KEY)}" in words(html)
    assert "No run checks" not in html


def test_a_page_holding_only_the_bad_run_does_not_say_that_no_run_checks(db):
    # Given the bad run alone on the first page of one run each (good runs on the next pages)
    add_alien(db)
    with client_for(make_app(db, limit=1)) as client:
        # When that page is opened
        html = client.get("/").text
    # Then it flags the run, and does not claim that nothing checks
    assert re.findall(r'data-run="([^"]+)"', html) == ["alien-1"]
    assert "No run checks" not in html and "1 run is signed with a key" in words(html)


def test_the_run_page_names_the_key_id_its_rows_carry(db):
    # Given a run signed with another key
    add_alien(db)
    # When its page is opened
    with client_for(make_app(db)) as client:
        html = client.get("/runs/alien-1").text
    # Then it is shown as corrupt, naming the key id of its rows, with nothing read from them
    assert "Rows of this run fail their check" in html
    assert f"Its rows name key id {key_id(OTHER_KEY)}, which this viewer does not hold" in words(html)
    assert "Oslo" not in html
