"""A real deployment per test: Celery worker processes on the machine's Redis, own prefix and queue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery_kit import Deployment


@pytest.fixture
def deployment(tmp_path: Path, redis_url: str) -> Iterator[Deployment]:
    dep = Deployment(tmp_path, redis_url)
    yield dep
    dep.close()
