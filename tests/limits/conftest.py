"""Registers limit_backends.py's fixtures with pytest for this folder (the code lives there, type-checked)."""

from limit_backends import backend, prefix

__all__ = ["backend", "prefix"]
