"""The runnable Celery app: ``celery -A workers worker|beat|flower`` (wiring only)."""

from workers.app import app

__all__ = ["app"]
