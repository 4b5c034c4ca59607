"""Registers viewer_fixtures.py's fixtures with pytest for this folder (the code lives there, type-checked)."""

from viewer_fixtures import browser, built_db, db, local, ops, page, shots, viewer_url

__all__ = ["browser", "built_db", "db", "local", "ops", "page", "shots", "viewer_url"]
