"""Registers celery_fixtures.py's fixtures with pytest for this folder (the code lives there, type-checked)."""

from celery_fixtures import deployment, s, shared, shared_host

__all__ = ["deployment", "s", "shared", "shared_host"]
