"""The store set-up a contract test gets: `StoreFactory`, made by store_setups.py (the `store_factory` fixture).

Imported as ``store_kit`` (tests/checkpoints is on ``sys.path`` under pytest's prepend import mode),
so a test can annotate the ``store_factory`` fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentflow.exec.checkpoints import CheckpointStore


@dataclass
class StoreFactory:
    """Opens stores over one set-up's backing storage (every call sees the same data)."""

    name: str
    """The set-up's name, e.g. ``sqlite`` or ``sqlalchemy-pg``."""
    make: Callable[[], CheckpointStore]
    """Builds a new store object over the backing storage."""
    spec: dict[str, Any] | None
    """How `race_worker.py` opens the same storage in another process; None for in-process set-ups."""
    opened: list[CheckpointStore] = field(default_factory=list)
    """Every store handed out, closed when the test ends."""

    async def __call__(self) -> CheckpointStore:
        store = self.make()
        self.opened.append(store)
        return store


#: What a set-up yields: how to make a store, and the spec `race_worker.py` opens it from (or None).
Opened = tuple[Callable[[], CheckpointStore], dict[str, Any] | None]
