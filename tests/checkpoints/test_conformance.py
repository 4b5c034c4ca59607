"""Every store set-up keeps every rule of `CheckpointStore` (the checks live in `conformance.py`)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from store_kit import StoreFactory

from agentflow.exec.checkpoints import (
    CheckpointStore,
    MemoryCheckpointStore,
    SealedCall,
    SealedCheckpoint,
    StoreDefaults,
)
from agentflow.exec.checkpoints.conformance import CHECKS, SEALER, Check, check_implements_protocol, validate
from agentflow.exec.checkpoints.records import Lease, Marker
from agentflow.exec.checkpoints.rules import check_lease_args, check_row

RACE_WORKER = Path(__file__).with_name("race_worker.py")
RACERS = 4
RACE_ROUNDS = 5


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__.removeprefix("check_") for c in CHECKS])
async def test_store_keeps_rule(store: CheckpointStore, check: Check) -> None:
    # Given an empty store of one set-up
    # When the check exercises its rule (named in the test id and the check's docstring)
    # Then the store keeps it: the check raises nothing
    await check(store)


class LastWriterWins(MemoryCheckpointStore):
    """A broken store: `save` overwrites whatever is there instead of comparing and setting."""

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        check_row(run_id, step, checkpoint)
        rows = self._checkpoints.setdefault(run_id, [])
        del rows[step:]
        rows.append(checkpoint)
        self._listed[run_id] = None


async def test_validate_passes_a_correct_store() -> None:
    # Given the reference store
    # When validate runs every check, each on a fresh store
    report = await validate(MemoryCheckpointStore)
    # Then every check is reported, and none failed
    assert list(report) == [c.__name__ for c in CHECKS]
    assert {name: why for name, why in report.items() if why} == {}


async def test_validate_fails_a_store_without_compare_and_set() -> None:
    # Given a store whose save is last-writer-wins
    # When validate runs every check
    report = await validate(LastWriterWins)
    # Then exactly the compare-and-set checks fail, each with a message saying what went wrong
    failed = {name for name, why in report.items() if why}
    assert failed == {
        "check_new_run_starts_at_step_zero",
        "check_second_step_zero_conflicts",
        "check_save_is_exactly_latest_plus_one",
        "check_ended_run_takes_no_save",
        "check_failed_run_takes_only_the_next_step",
        "check_run_never_changes_flow",
        "check_concurrent_first_saves",
        "check_concurrent_next_saves",
    }
    assert "but the store accepted it" in str(report["check_second_step_zero_conflicts"])
    assert "20 of 20 racers won" in str(report["check_concurrent_next_saves"])


class CoreOnly:
    """A store written outside agentflow: the core methods, `stored_runs`, `relist`, leases and markers, over memory."""

    in_process = False

    def __init__(self) -> None:
        self._inner = MemoryCheckpointStore()

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        await self._inner.save(run_id, step, checkpoint)

    async def latest(self, run_id: str) -> SealedCheckpoint:
        return await self._inner.latest(run_id)

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        return await self._inner.history(run_id)

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        return await self._inner.list_unfinished(flow)

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        return await self._inner.list_runs(flow, limit)

    async def delete(self, run_id: str) -> None:
        await self._inner.delete(run_id)

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        await self._inner.record_call(run_id, record)

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        return await self._inner.calls(run_id)

    async def stored_runs(self) -> Sequence[str]:
        return await self._inner.stored_runs()

    async def relist(self, run_id: str) -> SealedCheckpoint | None:
        return await self._inner.relist(run_id)

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        return await self._inner.take_lease(run_id, owner, token, ttl_s)

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        return await self._inner.renew_lease(run_id, token, ttl_s)

    async def release_lease(self, run_id: str, token: str) -> bool:
        return await self._inner.release_lease(run_id, token)

    async def leases(self, run_ids: Sequence[str]) -> Mapping[str, Lease]:
        return await self._inner.leases(run_ids)

    async def put_marker(self, key: str, value: str, token: str, ttl_s: float) -> Marker:
        return await self._inner.put_marker(key, value, token, ttl_s)

    async def peek_markers(self, keys: Sequence[str]) -> Mapping[str, Marker]:
        return await self._inner.peek_markers(keys)

    async def take_marker(self, key: str, token: str) -> bool:
        return await self._inner.take_marker(key, token)

    async def aclose(self) -> None:
        await self._inner.aclose()


class WithDefaults(StoreDefaults, CoreOnly):
    """The same store taking head, save_after_calls and local_key from `StoreDefaults`."""


class RacyLeases(MemoryCheckpointStore):
    """A broken store: `take_lease` awaits between reading the lease and writing it."""

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        check_lease_args(owner, token, ttl_s)
        held = self._live(run_id)
        await asyncio.sleep(0)  # every racer reads "free" before any of them writes
        if held is not None and held.token != token:
            return held
        self._leases[run_id] = Lease(run_id, owner, token, time.time() + ttl_s)
        return self._leases[run_id]


async def test_validate_fails_a_store_whose_lease_take_is_not_atomic() -> None:
    # Given a store whose take reads, awaits, then writes
    # When validate runs every check
    report = await validate(RacyLeases)
    # Then the racing takers check fails (every racer got the lease), and it alone
    assert {name for name, why in report.items() if why} == {"check_lease_race_of_takers"}
    assert "20 of 20 racers took the lease" in str(report["check_lease_race_of_takers"])


async def test_a_store_built_on_store_defaults_passes_every_check() -> None:
    # Given a store that implements only the core methods, stored_runs, relist, leases and markers, plus the mixin
    # When validate runs every check on it
    report = await validate(WithDefaults)
    # Then it passes all of them: the defaults keep the contract (save_after_calls checks first)
    assert {name: why for name, why in report.items() if why} == {}


async def test_a_store_without_the_full_contract_is_told_what_it_lacks() -> None:
    # Given the same store without the mixin
    # When the protocol check runs, Then it fails naming the members it lacks
    with pytest.raises(AssertionError, match="lacks local_key, save_after_calls, head"):
        await check_implements_protocol(CoreOnly())  # type: ignore[arg-type]


class WithoutLeases(StoreDefaults):
    """A store written outside agentflow that forgot the lease and marker methods (StoreDefaults has none)."""

    in_process = False
    save = CoreOnly.save
    latest = CoreOnly.latest
    history = CoreOnly.history
    list_unfinished = CoreOnly.list_unfinished
    list_runs = CoreOnly.list_runs
    delete = CoreOnly.delete
    record_call = CoreOnly.record_call
    calls = CoreOnly.calls
    stored_runs = CoreOnly.stored_runs
    relist = CoreOnly.relist
    aclose = CoreOnly.aclose

    def __init__(self) -> None:
        self._inner = MemoryCheckpointStore()


async def test_a_store_without_leases_is_told_they_have_no_default() -> None:
    # Given a store with every member but the four lease and three marker methods, and the mixin
    # When the protocol check runs, Then it fails naming them, without pointing at StoreDefaults
    lacks = "take_lease, renew_lease, release_lease, leases, put_marker, peek_markers, take_marker"
    with pytest.raises(AssertionError, match=f"lacks {lacks}$"):
        await check_implements_protocol(WithoutLeases())  # type: ignore[arg-type]


async def test_a_shared_store_with_a_key_of_its_own_fails() -> None:
    # Given a store that says it is shared but offers a signing key of its own
    store = WithDefaults()
    store.local_key = b"k" * 32
    # When the protocol check runs, Then it fails: a shared store must leave signing to checkpoint_key
    with pytest.raises(AssertionError, match="local_key None"):
        await check_implements_protocol(store)


async def _start_racer(spec: dict[str, object], worker: int) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(RACE_WORKER),
        json.dumps({**spec, "worker": worker}),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _line(racer: asyncio.subprocess.Process) -> str:
    assert racer.stdout is not None and racer.stderr is not None
    line = await asyncio.wait_for(racer.stdout.readline(), timeout=60)
    if not line:
        err = (await racer.stderr.read()).decode(errors="replace")
        raise AssertionError(f"racer exited early:\n{err}")
    return line.decode().strip()


#: The set-ups several processes can share (memory and fakeredis live inside one process).
SHARED = [
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    "sqlalchemy-sqlite",
    pytest.param("sqlalchemy-pg", marks=pytest.mark.postgres),
]


async def _stop(racers: Sequence[asyncio.subprocess.Process]) -> None:
    """End the racers (EOF on stdin), killing any that does not exit in time; each must exit 0."""
    for racer in racers:
        if racer.stdin is not None:
            racer.stdin.close()
    for racer in racers:
        try:
            await asyncio.wait_for(racer.wait(), timeout=30)
        except TimeoutError:
            racer.kill()
            await racer.wait()
    assert [r.returncode for r in racers] == [0] * len(racers)


@pytest.mark.slow
@pytest.mark.parametrize("store_factory", SHARED, indirect=True)
async def test_processes_race_for_one_step(store_factory: StoreFactory) -> None:
    assert store_factory.spec is not None
    # Given a run at step 0 and four processes connected to the same store
    store = await store_factory()
    run_id = f"race-{uuid.uuid4().hex}"
    await store.save(run_id, 0, SEALER.seal_checkpoint(run_id, 0, "race", "running", 0, time.time(), {"step": 0}))
    spec = {**store_factory.spec, "run_id": run_id, "flow": "race"}
    racers = [await _start_racer(spec, worker) for worker in range(RACERS)]
    try:
        assert [await _line(r) for r in racers] == ["ready"] * RACERS
        for step in range(1, RACE_ROUNDS + 1):
            # When all of them try to save the same next step at once
            for racer in racers:
                assert racer.stdin is not None
                racer.stdin.write(f"go {step}\n".encode())
            await asyncio.gather(*(r.stdin.drain() for r in racers if r.stdin is not None))
            results = [json.loads(await _line(r)) for r in racers]
            # Then exactly one wins, the others get CheckpointConflict, and the winner's row is stored
            outcomes = sorted(r["result"] for r in results)
            assert outcomes == ["conflict"] * (RACERS - 1) + ["won"], f"step {step}: {results}"
            winner = next(i for i, r in enumerate(results) if r["result"] == "won")
            latest = await store.latest(run_id)
            assert latest.step == step
            assert SEALER.open_checkpoint(latest, run_id)["worker"] == winner
    finally:
        await _stop(racers)


#: The shared set-ups the lease race runs on: a file, PostgreSQL and Redis (each judges expiry on its own clock).
LEASE_SHARED = [
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("sqlalchemy-pg", marks=pytest.mark.postgres),
]
LEASE_RACERS = 4
LEASE_ROUNDS = 3


@pytest.mark.slow
@pytest.mark.parametrize("store_factory", LEASE_SHARED, indirect=True)
async def test_processes_race_for_one_lease(store_factory: StoreFactory) -> None:
    assert store_factory.spec is not None
    store = await store_factory()
    await store.leases([])  # sets the store up before the racers connect
    # Given four processes connected to the same store
    spec = {**store_factory.spec, "run_id": "lease-race-warm-up", "flow": "race"}
    racers = [await _start_racer(spec, worker) for worker in range(LEASE_RACERS)]
    try:
        assert [await _line(r) for r in racers] == ["ready"] * LEASE_RACERS
        for round_ in range(LEASE_ROUNDS):
            # When all of them take the lease of one free run at the same instant
            run_id = f"lease-race-{uuid.uuid4().hex}"
            at = time.time() + 0.2
            for racer in racers:
                assert racer.stdin is not None
                racer.stdin.write(f"take {run_id} {at!r}\n".encode())
            await asyncio.gather(*(r.stdin.drain() for r in racers if r.stdin is not None))
            results = [json.loads(await _line(r)) for r in racers]
            # Then exactly one gets it, every loser was told the winner's token, and the store shows the winner
            outcomes = sorted(r["result"] for r in results)
            assert outcomes == ["lost"] * (LEASE_RACERS - 1) + ["won"], f"round {round_}: {results}"
            winner = next(r["token"] for r in results if r["result"] == "won")
            assert {r["holder"] for r in results} == {winner}
            held = await store.leases([run_id])
            assert held[run_id].token == winner
    finally:
        await _stop(racers)
