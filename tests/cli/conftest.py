"""Registers cli_fixtures.py's fixtures with pytest for this folder (the code lives there, type-checked)."""

from cli_fixtures import agentflow, built_db, db, url

__all__ = ["agentflow", "built_db", "db", "url"]
