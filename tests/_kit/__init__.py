"""The shared test kit: one ticket flow, one fault-injecting store wrapper, every store set-up.

Imported as ``_kit`` (``from _kit.tickets import ...``). tests/ has no ``__init__.py``, so
pytest's default ``prepend`` import mode puts tests/ on ``sys.path`` when it loads
tests/conftest.py, before any test module. A worker subprocess gets tests/ on its
``PYTHONPATH`` instead (`_kit.specs.child_env`).

- `_kit.tickets`: the Order state, the ledger of real effects, the ticket tools and flows.
- `_kit.faults`: `FaultyStore`, a wrapper around any store that crashes or fails at the Nth
  write of a chosen kind, meets a rival worker before its first write, and logs what it did.
- `_kit.specs`: store specs a worker subprocess opens (`open_spec`), and its environment (`child_env`).
- `_kit.workers`: the ``workers`` fixture: runners on `FaultyStore`s over one set-up, sharing the ticket tools.
- `_kit.stores`: the store set-ups (memory, SQLite, fakeredis, Redis, SQLAlchemy on SQLite and
  on PostgreSQL), each with raw access to its rows for tamper tests, and the fixtures
  ``store_setup`` / ``any_store`` (every set-up) and ``shared_spec`` (set-ups another process can open).
"""
