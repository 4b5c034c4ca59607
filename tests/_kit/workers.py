"""Workers over one store set-up: each a `FlowRunner` of its own on a `FaultyStore`, sharing the ticket tools.

The ``workers`` fixture (registered in tests/conftest.py) gives one `Workers` per store
set-up (`_kit.stores.store_setup`): ``workers.runner()`` is a new worker (its own store
object over the shared storage, its own executor); ``workers.ran()`` is what the ticket
tools really did; ``workers.rows`` changes rows behind the stores' backs.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from _kit.faults import FaultyStore
from _kit.stores import Rows, StoreSetup
from _kit.tickets import KEY, Ledger, Tickets, make_tickets
from agentflow import Event, Events, Executor, FlowRunner, Registry
from agentflow.exec.checkpoints import CheckpointStore, SealedCall, SealedCheckpoint


@dataclasses.dataclass
class Workers:
    """Runners ("workers") over one set-up's storage, the ticket tools they share, and the events they emit."""

    setup: StoreSetup
    tickets: Tickets = dataclasses.field(default_factory=make_tickets)
    hub: Events = dataclasses.field(default_factory=Events)
    events: list[Event] = dataclasses.field(default_factory=list)
    atomic_saves: bool = False
    """Whether a worker's store writes a held ``done`` with its checkpoint in one go (`FaultyStore`).

    False by default: the durable-run tests crash between a superstep's last ``done`` and its
    checkpoint, a state a node function's call also leaves behind."""

    def __post_init__(self) -> None:
        self.hub.subscribe(self.events.append)

    @property
    def name(self) -> str:
        """The set-up's id (``memory``, ``sqlite``, ...)."""
        return self.setup.name

    @property
    def ledger(self) -> Ledger:
        """Every real effect of the ticket tools."""
        return self.tickets.ledger

    @property
    def raw(self) -> CheckpointStore:
        """The set-up's store as a test reads it (never wrapped)."""
        return self.setup.raw

    @property
    def rows(self) -> Rows:
        """The set-up's rows, behind the stores' backs."""
        return self.setup.rows

    def ran(self, run_id: str | None = None) -> Counter[str]:
        """How often each tool's effect happened (a snapshot: compare before and after)."""
        return self.ledger.counts(run_id)

    def store(self) -> FaultyStore:
        """A new worker's store: a new store object over the shared storage, wrapped."""
        return FaultyStore(self.setup.open(), trace=self.tickets.trace, atomic_saves=self.atomic_saves)

    def runner(
        self,
        *,
        key: bytes | list[bytes] = KEY,
        approver: Callable[..., Any] | None = None,
        store: FaultyStore | None = None,
        registry: Registry | None = None,
    ) -> FlowRunner:
        """A new worker: its own executor (on the shared tools, or `registry`: another deploy's) and its own store."""
        executor = Executor(registry or self.tickets.registry, approver=approver, events=self.hub)
        return FlowRunner(executor, checkpoints=store or self.store(), checkpoint_key=key)

    def named(self, name: str) -> list[Event]:
        """The events called `name`, in order."""
        return [e for e in self.events if e.name == name]

    async def calls(self, run_id: str) -> list[SealedCall]:
        """The run's call records as stored."""
        return await self.setup.calls(run_id)

    async def history(self, run_id: str) -> list[SealedCheckpoint]:
        """The run's checkpoints as stored."""
        return await self.setup.history(run_id)


def faulty(runner: FlowRunner) -> FaultyStore:
    """The `FaultyStore` a `Workers.runner` runs on."""
    store = runner.checkpoints
    assert isinstance(store, FaultyStore), store
    return store


@pytest.fixture
def workers(store_setup: StoreSetup) -> Workers:
    """Workers with the ticket tools over each store set-up in turn."""
    return Workers(store_setup)


async def advance_all(runner: Any, run_id: str, step: int = 0) -> Any:
    """Advance a loop's or an agent's run stage by stage from `step`, as the workers' messages would, until it stops.

    `runner` is its `LoopRunner` or `AgentRunner`; returns the outcome of the last stage.
    """
    while (result := await runner.advance(run_id, expected_step=step, handoff=True)).status == "running":
        assert result.step is not None
        step = result.step
    return result
