"""The runnable Celery app: ``celery -A workers worker|beat|flower`` (wiring only).

The app is built on first access, so importing `workers.build` (tests, scripts) reads no
settings from the environment.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("app", "tasks"):
        from workers import celery_app

        return getattr(celery_app, name)
    raise AttributeError(f"module 'workers' has no attribute {name!r}")
