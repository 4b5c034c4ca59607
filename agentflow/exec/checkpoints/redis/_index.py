"""The listing indexes of `RedisCheckpointStore`: three sorted sets beside the runs' own keys.

Key layout (``P`` is the store's prefix)::

    P:runs                zset   run id -> saved_at of its newest save (every flow)
    P:runs:<flow>         zset   run id -> saved_at of its newest save
    P:unfinished:<flow>   zset   run id, for runs last saved running or paused

On one Redis server the save and relist scripts update the three indexes themselves,
atomically, and score ``unfinished`` entries by when the run's keys expire, so listing
them is one script (``_lua/unfinished.lua``) with no per-run read. On Redis Cluster they
are not in the run's slot, so no script may update them together with the run; separate
commands do (`update`): before a step 0 the run is added to them (a crash right after the
script then cannot hide a new run), and after every save or relist its scores are updated
(``unfinished`` scored by saved_at there) and an ended run leaves ``unfinished``. An index
can therefore name a run that has since ended, expired, been deleted or never been saved.
The listings read each named run's latest state in one pipelined round trip, skip such
entries and remove them with ``_lua/prune.lua``: ended runs at once, runs without keys
only `STALE_AFTER_S` after their index score, since a step 0 may sit between its index
update and its script. No listing uses KEYS or SCAN.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, Final

from agentflow.exec.checkpoints.records import UNFINISHED, SealedCheckpoint, listed
from agentflow.exec.checkpoints.redis._rows import _decode_checkpoint, _scored, _text
from agentflow.exec.checkpoints.redis.clients import MAX_PIPELINE, Bound

#: Age (seconds, by index score) after which an index entry whose run has no keys is removed.
STALE_AFTER_S: Final = 300.0


class Index:
    """The listing indexes under one prefix; `run_keys` names a run's own keys (cp, latest, calls, next)."""

    def __init__(self, prefix: str, run_keys: Callable[[str], list[str]]) -> None:
        self._prefix = prefix
        self._run_keys = run_keys

    def keys(self, flow: str) -> list[str]:
        """The indexes a run of `flow` is in: all runs, the flow's runs, its unfinished runs."""
        return [f"{self._prefix}:runs", f"{self._prefix}:runs:{flow}", f"{self._prefix}:unfinished:{flow}"]

    async def update(self, bound: Bound, run_id: str, cp: SealedCheckpoint, *, before: bool) -> None:
        """On Cluster: add the run before its step 0 (`before`), or bring its entries up to date with `cp`."""
        score = {run_id: cp.saved_at}
        every, of_flow, unfinished = self.keys(cp.flow)
        pipe = bound.client.pipeline(transaction=False)
        pipe.zadd(every, score, nx=before)
        pipe.zadd(of_flow, score, nx=before)
        if cp.status in UNFINISHED:
            pipe.zadd(unfinished, score, nx=before)
        elif not before:
            pipe.zrem(unfinished, run_id)
        await pipe.execute()

    async def unfinished(self, bound: Bound, flow: str) -> list[str]:
        """The ids of the flow's running and paused runs (on Cluster, checked against each run's latest hash)."""
        index = self.keys(flow)[2]
        if not bound.cluster:  # the index is exact: one round trip
            return [_text(run_id) for run_id in await bound.scripts["unfinished"](keys=[index], args=[])]
        entries = _scored(await bound.client.zrange(index, 0, -1, withscores=True))
        states: list[list[Any]] = []
        for start in range(0, len(entries), MAX_PIPELINE):
            pipe = bound.client.pipeline(transaction=False)
            for run_id, _ in entries[start : start + MAX_PIPELINE]:
                pipe.hmget(self._run_keys(run_id)[1], ["flow", "status"])
            states += await pipe.execute()
        found, stale = [], []
        for (run_id, score), (run_flow, status) in zip(entries, states, strict=True):
            if run_flow is None:
                if score < time.time() - STALE_AFTER_S:
                    stale.append((run_id, score))
            elif _text(run_flow) == flow and _text(status) in UNFINISHED:
                found.append(run_id)
            else:
                stale.append((run_id, score))
        await self.forget(bound, index, stale)
        return found

    async def runs(self, bound: Bound, flow: str | None, limit: int) -> list[SealedCheckpoint]:
        """The newest checkpoint of up to `limit` listed runs (of one flow, or all), newest first."""
        index = f"{self._prefix}:runs" if flow is None else self.keys(flow)[1]
        found: dict[str, SealedCheckpoint] = {}
        stale: list[tuple[str, float]] = []
        start, page = 0, min(max(limit, 100), MAX_PIPELINE)
        while len(found) < limit:
            entries = _scored(await bound.client.zrevrange(index, start, start + page - 1, withscores=True))
            if not entries:
                break
            start += len(entries)
            pipe = bound.client.pipeline(transaction=False)
            for run_id, _ in entries:
                pipe.lindex(self._run_keys(run_id)[0], -1)
            for (run_id, score), raw in zip(entries, await pipe.execute(), strict=True):
                if raw is None:
                    if score < time.time() - STALE_AFTER_S:
                        stale.append((run_id, score))
                    continue
                cp = listed(run_id, partial(_decode_checkpoint, run_id, raw, "the latest checkpoint"))
                if flow is not None and cp.flow != flow:
                    stale.append((run_id, score))
                else:
                    found[run_id] = cp
        await self.forget(bound, index, stale)
        return sorted(found.values(), key=lambda cp: cp.saved_at, reverse=True)[: max(limit, 0)]

    async def forget(self, bound: Bound, index: str, stale: list[tuple[str, float]]) -> None:
        """Remove ``(run id, score)`` entries from `index`, each only if its score is still the one given."""
        if stale:
            args = [part for run_id, score in stale for part in (run_id, repr(score))]
            await bound.scripts["prune"](keys=[index], args=args)
