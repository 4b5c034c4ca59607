"""Registers adapter_fixtures.py's fixtures with pytest for this folder (the code lives there, type-checked)."""

from adapter_fixtures import kind, stub

__all__ = ["kind", "stub"]
