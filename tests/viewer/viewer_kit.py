"""Helpers of the viewer tests: apps over a copy of the runs store, clients, a uvicorn server.

Imported as ``viewer_kit`` (tests/viewer is on ``sys.path`` under pytest's prepend import mode).
``runs_kit`` is tests/cli/runs_kit.py, loaded by path under the name the CLI tests use (`load_kit`
loads another folder's kit the same way).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.testclient import TestClient
from starlette.types import ASGIApp

from agentflow import FlowApp
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.viewer import ViewerSettings, create_app
from agentflow.viewer._serve import UVICORN_OPTIONS, ViewerServer, bound


def load_kit(name: str, folder: str) -> ModuleType:
    """tests/<folder>/<name>.py, as the module `name` (the name that folder's own tests import it under)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


runs_kit = load_kit("runs_kit", "cli")

LOCAL = ("127.0.0.1", 50000)
#: Where test clients send requests: a loopback name the viewer trusts (TestClient's own "testserver" is not).
BASE = "http://127.0.0.1"
TOKEN = "viewer-token-0123456789abcdef"
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def settings_for(
    db: Path,
    *,
    flows: FlowApp | None = runs_kit.app,
    token: str | None = None,
    key: bytes = runs_kit.KEY,
    refresh_s: int = 5,
    **more: Any,
) -> ViewerSettings:
    """Settings of a viewer over `db`; `more` are further `ViewerSettings` (allowed_hosts, port, proxies, limit)."""
    store = SQLiteCheckpointStore(db)
    return ViewerSettings(store, [key], flows=flows, token=token, label=f"sqlite:///{db}", refresh_s=refresh_s, **more)


def make_app(db: Path, **settings: Any) -> Starlette:
    """A viewer over `db` (`settings` as `settings_for` takes them)."""
    return create_app(settings_for(db, **settings))


@contextmanager
def client_for(app: ASGIApp, client: tuple[str, int] = LOCAL, base_url: str = BASE) -> Iterator[TestClient]:
    """A test client that reaches the viewer as a browser on this machine would (``Host: 127.0.0.1``)."""
    with TestClient(app, client=client, base_url=base_url, follow_redirects=False) as test_client:
        yield test_client


def csrf_of(page_html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', page_html)
    assert found, "the page has no resume form"
    return found.group(1)


def unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must provide it", pytrace=False)
    pytest.skip(reason)


@contextmanager
def served(app: ASGIApp) -> Iterator[str]:
    """Serve `app` with uvicorn (as `serve` runs it) on a free loopback port, in a thread; yield its base URL."""
    with _served(lambda port: app) as base:
        yield base


@contextmanager
def served_like_serve(settings: ViewerSettings) -> Iterator[str]:
    """Serve a viewer exactly as `serve` would on 127.0.0.1 (its settings bound to the port); yield its base URL."""
    with _served(lambda port: create_app(bound(settings, "127.0.0.1", port))) as base:
        yield base


@contextmanager
def _served(make: Callable[[int], ASGIApp]) -> Iterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    server = ViewerServer(uvicorn.Config(make(port), lifespan="on", **UVICORN_OPTIONS))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
