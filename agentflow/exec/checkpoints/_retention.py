"""Retention: how long finished runs are kept, and the prune that removes older ones in batches.

- `RetentionPolicy`: keep finished runs (``done``, ``failed``, ``cancelled``, or some of
  them) this long after their last save; a running or paused run is never pruned, however
  old. The CLI (``agentflow runs prune``) and the workers' beat task each apply one.
- `prunable` and `prune`: the store's own (`RetentionStore`, batched, atomic per run) when
  it has them, else the generic versions built on the rest of the port (`_defaults`), so a
  store wrapped by something that forwards only `CheckpointStore` is pruned all the same.
- `prune_finished`: batch after batch, each listed and then pruned, until a batch prunes
  nothing or `max_batches` is reached (the beat's bound per tick).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final

from agentflow.exec.checkpoints._defaults import default_prunable, default_prune
from agentflow.exec.checkpoints._protocol import CheckpointStore, RetentionStore
from agentflow.exec.checkpoints._records import ENDED, Pruned
from agentflow.exec.checkpoints._rules import check_prune_statuses

#: Runs per batch when nobody says otherwise.
DEFAULT_BATCH: Final = 500
#: One day, in seconds.
DAY_S: Final = 86_400.0


@dataclass(frozen=True)
class RetentionPolicy:
    """Which finished runs a store keeps: those saved within `keep_s`, and any run not yet ended."""

    keep_s: float
    """A finished run is kept this long after its last save (seconds), then pruned."""
    statuses: frozenset[str] = ENDED
    """Which finished runs are pruned: some of ``done``, ``failed``, ``cancelled`` (never running or paused)."""
    batch: int = DEFAULT_BATCH
    """Runs listed and deleted per batch (one transaction, or one pipeline of scripts)."""

    def __post_init__(self) -> None:
        if isinstance(self.keep_s, bool) or not self.keep_s >= 0:
            raise ValueError(f"keep_s must be a number of seconds, zero or more; got {self.keep_s!r}")
        object.__setattr__(self, "statuses", frozenset(check_prune_statuses(self.statuses)))
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"batch must be a whole number of runs, 1 or more; got {self.batch!r}")

    @classmethod
    def days(cls, days: float, statuses: Collection[str] = ENDED, batch: int = DEFAULT_BATCH) -> RetentionPolicy:
        """Keep finished runs for `days` days after their last save."""
        return cls(days * DAY_S, frozenset(statuses), batch)

    def cut_off(self, now: float | None = None) -> float:
        """The time before which a finished run's last save makes it prunable."""
        return (time.time() if now is None else now) - self.keep_s


def pruner(name: str = "prune") -> str:
    """The lease owner a prune in this process holds runs as: ``<name>@<host>:<pid>``."""
    return f"{name}@{socket.gethostname()}:{os.getpid()}"


async def prunable(store: CheckpointStore, before: float, statuses: Collection[str], limit: int) -> list[str]:
    """The runs a prune would take now, oldest first (the store's own listing, or the generic one)."""
    if isinstance(store, RetentionStore):
        return list(await store.prunable(before, statuses, limit))
    return await default_prunable(store, before, statuses, limit)


async def prune(
    store: CheckpointStore, run_ids: Sequence[str], before: float, statuses: Collection[str], owner: str
) -> Pruned:
    """Delete each run of `run_ids` that still qualifies, whole (the store's own prune, or the generic one)."""
    if not run_ids:
        return Pruned((), 0)
    if isinstance(store, RetentionStore):
        return await store.prune(run_ids, before, statuses, owner)
    return await default_prune(store, run_ids, before, statuses, owner)


async def prune_finished(
    store: CheckpointStore,
    policy: RetentionPolicy,
    *,
    now: float | None = None,
    owner: str | None = None,
    max_batches: int | None = None,
    on_batch: Callable[[Pruned], None] | None = None,
) -> Pruned:
    """Prune the runs `policy` no longer keeps, batch by batch; return what was deleted.

    Each batch lists up to ``policy.batch`` prunable runs, oldest first, and prunes them
    (each judged again as it goes). It stops when a batch prunes nothing (all done, or the
    runs left are held or changed) or after `max_batches` batches.

    Args:
        store: the store to prune.
        policy: what to keep.
        now: the time the cut-off is counted from (default: now).
        owner: who holds each run's lease while it is deleted (default: ``prune@<host>:<pid>``).
        max_batches: stop after this many batches (None: until done).
        on_batch: called with what each batch deleted (progress).
    """
    before = policy.cut_off(now)
    who = owner or pruner()
    total = Pruned((), 0)
    batches = 0
    while max_batches is None or batches < max_batches:
        batches += 1
        run_ids = await prunable(store, before, policy.statuses, policy.batch)
        done = await prune(store, run_ids, before, policy.statuses, who)
        if on_batch is not None:
            on_batch(done)
        total += done
        if not done.run_ids:
            break
    return total
