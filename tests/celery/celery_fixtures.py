"""The Celery tests' fixtures: a real deployment per test (worker processes on the machine's Redis, own prefix
and queue), or a shared one. tests/celery/conftest.py registers them.

``deployment``: a deployment of the test's own, with no process yet; the test starts, kills,
freezes or reconfigures its workers. ``shared``: worker ``w1`` of the kit app, shared by the
tests of this pytest process that only need a worker to run their runs (none kills, freezes
or reconfigures it, nor reads its log but for its own runs' lines): started once, checked
before each test (it answers and holds no task), started again if a test left it dead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from celery_kit import Deployment
from worker_kit import Setup


@pytest.fixture
async def deployment(tmp_path: Path, redis_url: str) -> AsyncIterator[Deployment]:
    dep = Deployment(tmp_path, redis_url)
    try:
        yield dep
        await dep.aclose_clients()
    finally:
        dep.close()


@pytest.fixture(scope="session")
def shared_host(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Deployment]:
    """The deployment whose worker ``w1`` the ``shared`` tests of this process use; stopped at the session's end."""
    host = Deployment(tmp_path_factory.mktemp("shared-workers"), redis_url)
    try:
        yield host
    finally:
        host.close()


@pytest.fixture
async def shared(shared_host: Deployment) -> AsyncIterator[Deployment]:
    """This process's shared worker ``w1`` (running, answering, idle) and a client side of the test's own."""
    dep = shared_host.guest()
    try:
        # Asked through the guest's Celery app: the host's would keep a broker pool that the
        # last guest closed (apps on the same broker settings share kombu's pools).
        await asyncio.to_thread(dep.keep_serving, "w1")
        yield dep
        await dep.aclose_clients()
    finally:
        dep.close()


@pytest.fixture
async def s(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Setup]:
    """A fresh set-up whose task bodies record what they send; its worker's event loop is closed afterwards."""
    made = Setup()
    made.record_sends(monkeypatch)
    yield made
    await asyncio.to_thread(made.tasks.bridge.close)
