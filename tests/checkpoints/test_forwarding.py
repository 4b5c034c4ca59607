"""`ForwardingStore`: every operation through the hooks, in order, by name; the optional parts it forwards."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from agentflow.errors import CheckpointNotFound
from agentflow.exec.checkpoints import MemoryCheckpointStore, RetentionStore, TrimStore
from agentflow.exec.checkpoints.conformance import SEALER, validate
from agentflow.exec.checkpoints.forwarding import ForwardingStore
from agentflow.exec.checkpoints.protocol import EventStore, LeaseMoving, has_part

T = TypeVar("T")


class Noting:
    """A hook that notes what it saw before and after each operation."""

    def __init__(self, name: str, seen: list[tuple[Any, ...]]) -> None:
        self.name, self.seen = name, seen

    async def __call__(self, op: str, proceed: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> T:
        self.seen.append((self.name, "before", op, args))
        try:
            return await proceed(*args)
        finally:
            self.seen.append((self.name, "after", op))


async def test_each_operation_runs_through_the_hooks_in_order_named_by_its_method_with_its_arguments():
    # Given a memory store forwarded through two hooks
    seen: list[tuple[Any, ...]] = []
    inner = MemoryCheckpointStore()
    store = ForwardingStore(inner, [Noting("outer", seen), Noting("inner", seen)])
    checkpoint = SEALER.seal_checkpoint("r-1", 0, "audit", "running", 0, 1000.0, {})
    # When a checkpoint is saved and read back through it
    await store.save("r-1", 0, checkpoint)
    read = await store.latest("r-1")
    # Then the store did the work, the first hook ran outermost, and each saw the operation's name and arguments
    assert read == checkpoint == await inner.latest("r-1")
    assert seen == [
        ("outer", "before", "save", ("r-1", 0, checkpoint)),
        ("inner", "before", "save", ("r-1", 0, checkpoint)),
        ("inner", "after", "save"),
        ("outer", "after", "save"),
        ("outer", "before", "latest", ("r-1",)),
        ("inner", "before", "latest", ("r-1",)),
        ("inner", "after", "latest"),
        ("outer", "after", "latest"),
    ]


async def test_an_error_of_the_store_reaches_the_caller_through_the_hooks_unchanged():
    seen: list[tuple[Any, ...]] = []
    store = ForwardingStore(MemoryCheckpointStore(), [Noting("hook", seen)])
    # When a run the store does not have is read, Then the store's own error reaches the caller, after the hook
    with pytest.raises(CheckpointNotFound, match="nope"):
        await store.latest("nope")
    assert seen[-1] == ("hook", "after", "latest")


async def test_closing_runs_no_hook():
    seen: list[tuple[Any, ...]] = []
    async with ForwardingStore(MemoryCheckpointStore(), [Noting("hook", seen)]):
        pass
    assert seen == []


async def test_an_optional_part_is_forwarded_through_the_hooks_when_asked_for_and_the_store_has_it():
    seen: list[tuple[Any, ...]] = []
    inner = MemoryCheckpointStore()
    # Given a wrapper that forwards every part it can, and one asked for event streams only
    every = ForwardingStore(inner, [Noting("hook", seen)])
    events_only = ForwardingStore(inner, parts=[EventStore])
    # Then each has the parts the memory store has among those asked for, never retention or trimming
    assert has_part(every, EventStore) and has_part(every, LeaseMoving)
    assert has_part(events_only, EventStore) and not has_part(events_only, LeaseMoving)
    assert not any(has_part(store, part) for store in (every, events_only) for part in (RetentionStore, TrimStore))
    # And an optional operation runs through the hooks by its own name
    assert await every.read_events("r-1") == []
    assert seen == [("hook", "before", "read_events", ("r-1",)), ("hook", "after", "read_events")]


async def test_a_forwarding_store_with_no_hook_keeps_every_rule_of_the_store_it_wraps():
    report = await validate(lambda: ForwardingStore(MemoryCheckpointStore()))
    assert {name: why for name, why in report.items() if why} == {}
