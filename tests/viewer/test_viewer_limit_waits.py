"""The run page says which call of a live run waits for a shared limit, why, and since when."""

from __future__ import annotations

from viewer_kit import load_kit, runs_kit

limit_wait_kit = load_kit("limit_wait_kit", "cli")


def test_the_run_page_shows_a_call_waiting_for_a_limit(db, local):
    # Given a live run whose call waits for the one slot of limit "api", which another holder keeps
    with limit_wait_kit.waiting_run(db, "post-1", runs_kit.KEY):
        # When its page is opened
        page = local.get("/runs/post-1")

    # Then it is shown running on its worker, with the call waiting: the limit, why, since when
    assert page.status_code == 200
    html = page.text
    assert 'id="running-on"' in html and 'id="limit-waits"' in html
    waits = html[html.index('id="limit-waits"') :]
    assert "waiting for limit <code>api</code> (concurrency) since" in waits
    assert "<code>post</code> (0/send/0/" in waits

    # When it is opened again after the slot came free and the run finished
    after = local.get("/runs/post-1")

    # Then nothing is shown waiting
    assert after.status_code == 200 and 'id="limit-waits"' not in after.text
