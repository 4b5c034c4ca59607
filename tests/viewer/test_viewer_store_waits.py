"""The run page says a run waits for its store's durability (a worker's ``store-wait`` marker), and until when."""

from __future__ import annotations

from viewer_kit import load_kit

store_waits = load_kit("store_wait_kit", "cli")


def test_the_run_page_shows_a_run_waiting_for_its_store(db, local):
    # Given a run whose worker stopped because the store could not confirm its write
    before = local.get("/runs/ship-1")
    store_waits.wait_for_store(db, "ship-1", 30.0)
    # When its page is opened
    page = local.get("/runs/ship-1")
    # Then it says so, with the store's word and when the worker tries again (and did not before)
    assert before.status_code == 200 and 'id="store-wait"' not in before.text
    assert page.status_code == 200
    banner = page.text[page.text.index('id="store-wait"') :]
    assert "Waiting for its store&#39;s durability" in banner or "Waiting for its store's durability" in banner
    assert "the started record 1.0 is on the Redis primary" in banner and "Its worker tries again at" in banner
