"""Registers store_setups.py's fixtures with pytest for this folder (the code lives there, type-checked)."""

from store_setups import store, store_factory

__all__ = ["store", "store_factory"]
