"""The viewer tests' fixtures: a copy of runs_kit's store, clients and a served viewer over it, headless Chromium."""

from __future__ import annotations

from pathlib import Path

import ops_kit
import pytest
from viewer_kit import CHROMIUM, CHROMIUM_ARGS, SHOTS, client_for, make_app, runs_kit, served, unavailable


@pytest.fixture(scope="session")
def built_db(tmp_path_factory):
    return runs_kit.build_once(tmp_path_factory)


@pytest.fixture
def db(built_db, tmp_path):
    runs_kit.REFUNDS.clear()
    return runs_kit.copy_db(built_db, tmp_path / "runs.db")


@pytest.fixture
def local(db):
    """A client on this machine, with a viewer that knows the app's flows."""
    with client_for(make_app(db)) as test_client:
        yield test_client


@pytest.fixture
def ops(db):
    """A client on this machine, with a viewer over the kit's runs and quote-1 (failed), acting with `ops_kit.app`."""
    ops_kit.add_failed(db)
    with client_for(make_app(db, flows=ops_kit.app)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def browser():
    # Module scope: Playwright's sync API keeps an event loop running on the main thread while
    # it is open, and asyncio.run() (the CLI, other tests) refuses to start inside one.
    if not Path(CHROMIUM).exists():
        unavailable(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        unavailable(f"playwright is not installed ({exc})")
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    opened = context.new_page()
    yield opened
    context.close()


@pytest.fixture
def viewer_url(db):
    with served(make_app(db)) as base:
        yield base


@pytest.fixture(scope="session")
def shots() -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS
