"""Shared by the conformance checks: the test sealer, fresh ids, row builders and expectations.

Nothing here is a check; `conformance` is the public entry and re-exports `SEALER`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable
from typing import Any, Final

from agentflow.exec.checkpoints.protocol import CheckpointStore
from agentflow.exec.checkpoints.records import SealedCall, SealedCheckpoint
from agentflow.exec.seal import Sealer

#: Signs every row the checks write (a fixed test key: these rows are never trusted).
SEALER: Final = Sealer(b"conformance-key-0123456789abcdef")

_last_time = 0.0


def _now() -> float:
    """Return wall-clock time, strictly increasing across calls (so 'newest first' is well defined)."""
    global _last_time
    _last_time = max(time.time(), _last_time + 0.001)
    return _last_time


def _ids() -> tuple[str, str]:
    """Return a fresh (run id, flow name) pair."""
    tag = uuid.uuid4().hex
    return f"conformance-run-{tag}", f"conformance-flow-{tag[:12]}"


def _checkpoint(
    run_id: str, step: int, flow: str, status: str = "running", segment: int = 0, **body: Any
) -> SealedCheckpoint:
    # Non-ASCII text and escapes in every payload: a store must keep bytes, not text it re-encodes.
    return SEALER.seal_checkpoint(
        run_id, step, flow, status, segment, _now(), {"step": step, "note": 'ü ✓ "q" \\n', **body}
    )


def _call(run_id: str, segment: int, seq: int, kind: str = "started", **body: Any) -> SealedCall:
    return SEALER.seal_call(run_id, segment, seq, kind, {"at": f"{segment}.{seq}", "text": "€ ✓\n", **body})


async def _save_steps(store: CheckpointStore, run_id: str, flow: str, *statuses: str) -> list[SealedCheckpoint]:
    """Save steps 0..n-1 of a run with the given statuses; return the rows written."""
    rows = [_checkpoint(run_id, step, flow, status) for step, status in enumerate(statuses)]
    for row in rows:
        await store.save(run_id, row.step, row)
    return rows


async def _save_segment(store: CheckpointStore, run_id: str, flow: str, step: int, segment: int) -> None:
    await store.save(run_id, step, _checkpoint(run_id, step, flow, segment=segment))


def _expect(condition: bool, message: str) -> None:
    # Not `assert`: the checks must still check under `python -O`.
    if not condition:
        raise AssertionError(message)


async def _expect_raises(error: type[Exception], action: Awaitable[object], what: str) -> None:
    """Await `action` and fail unless it raises `error`."""
    try:
        await action
    except error:
        return
    except Exception as exc:
        raise AssertionError(f"{what}: expected {error.__name__}, got {type(exc).__name__}: {exc}") from exc
    raise AssertionError(f"{what}: expected {error.__name__}, but the store accepted it")


async def _expect_latest(store: CheckpointStore, run_id: str, row: SealedCheckpoint, why: str) -> None:
    got = await store.latest(run_id)
    _expect(got == row, f"{why}: latest is step {got.step} {got.payload!r}, expected step {row.step} {row.payload!r}")
