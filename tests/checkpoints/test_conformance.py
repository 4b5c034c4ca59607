"""Every store set-up keeps every rule of `CheckpointStore` (the checks live in `conformance.py`)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Sequence
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
from agentflow.exec.checkpoints._rules import check_row
from agentflow.exec.checkpoints.conformance import CHECKS, SEALER, Check, check_implements_protocol, validate

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
        "check_run_never_changes_flow",
        "check_concurrent_first_saves",
        "check_concurrent_next_saves",
    }
    assert "but the store accepted it" in str(report["check_second_step_zero_conflicts"])
    assert "20 of 20 racers won" in str(report["check_concurrent_next_saves"])


class CoreOnly:
    """A store written outside agentflow: the core methods, `stored_runs` and `relist`, over a memory store."""

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

    async def aclose(self) -> None:
        await self._inner.aclose()


class WithDefaults(StoreDefaults, CoreOnly):
    """The same store taking head, save_after_calls and local_key from `StoreDefaults`."""


async def test_a_store_built_on_store_defaults_passes_every_check() -> None:
    # Given a store that implements only the core methods, stored_runs and relist, plus the mixin
    # When validate runs every check on it
    report = await validate(WithDefaults)
    # Then it passes all of them: the defaults keep the contract (save_after_calls checks first)
    assert {name: why for name, why in report.items() if why} == {}


async def test_a_store_without_the_full_contract_is_told_what_it_lacks() -> None:
    # Given the same store without the mixin
    # When the protocol check runs, Then it fails naming the members it lacks
    with pytest.raises(AssertionError, match="lacks local_key, save_after_calls, head"):
        await check_implements_protocol(CoreOnly())  # type: ignore[arg-type]


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
        for racer in racers:
            if racer.stdin is not None:
                racer.stdin.close()
        for racer in racers:
            try:
                await asyncio.wait_for(racer.wait(), timeout=30)
            except TimeoutError:
                racer.kill()
                await racer.wait()
    assert [r.returncode for r in racers] == [0] * RACERS
