"""A real deployment per test: Celery worker processes on the machine's Redis, own prefix and queue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
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


@pytest.fixture
async def s(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Setup]:
    """A fresh set-up whose task bodies record what they send; its worker's event loop is closed afterwards."""
    made = Setup()
    made.record_sends(monkeypatch)
    yield made
    await asyncio.to_thread(made.tasks.bridge.close)
