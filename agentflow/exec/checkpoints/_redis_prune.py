"""Retention of `RedisCheckpointStore`: find finished runs by the time index, and delete them whole.

`prunable` reads ``P:runs`` (run id -> saved_at of its newest save) from the oldest entry up
to the cut-off, a page at a time, and checks each run's latest hash and lease key in one
pipelined round trip per page: a run qualifies when its status is one of the chosen ones,
its saved_at is before the cut-off and no lease key exists (it expires when the lease
lapses). An entry whose run has no keys left (expired by its TTL, deleted) is removed from
``P:runs`` as the listings remove it (`Index.forget`, only `STALE_AFTER_S` after its score).
No KEYS and no SCAN: the index is sorted by time.

`prune` reads the flow of each run asked for (one pipelined round trip per chunk), then
runs ``_lua/prune_run.lua`` for each, which judges the run again and deletes its six keys
in one step (no live lease: the script runs while nobody else can take one). On one server
the scripts also remove the run from the three indexes, and a chunk's scripts go in one
pipeline. On Redis Cluster each run's script goes to its slot's node (concurrently), and
the index entries, in other slots, are removed afterwards: an entry left by a prune cut
off there names a run with no keys, which every listing skips and removes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

from agentflow.exec.checkpoints._records import Pruned
from agentflow.exec.checkpoints._redis_clients import Bound, LoopClients
from agentflow.exec.checkpoints._redis_index import STALE_AFTER_S, Index
from agentflow.exec.checkpoints._redis_rows import _scored, _text
from agentflow.exec.checkpoints._rules import check_prune_statuses

#: Index entries read per page, and runs pruned per pipeline.
_PAGE: Final = 500
#: Scripts in flight at once on a Cluster (each on its own connection).
_CLUSTER_CALLS: Final = 32
#: The run's keys the prune script takes, in its KEYS order.
_PARTS: Final = ("cp", "latest", "calls", "next", "lease", "events")


class RedisPrune:
    """Retention under one prefix; `run_keys(run_id, parts)` names a run's keys (and checks the id)."""

    def __init__(self, clients: LoopClients, index: Index, prefix: str, run_keys: Callable[..., list[str]]) -> None:
        self._clients = clients
        self._index = index
        self._every = f"{prefix}:runs"
        self._keys = run_keys

    async def prunable(self, before: float, statuses: Collection[str], limit: int) -> list[str]:
        """The runs a prune would take now, oldest first (see the module docstring)."""
        chosen = set(check_prune_statuses(statuses))
        found: list[str] = []
        stale: list[tuple[str, float]] = []
        start = 0
        while len(found) < limit:
            async with self._clients.use() as bound:
                page = await bound.client.zrangebyscore(
                    self._every,
                    "-inf",
                    f"({before!r}",
                    start=start,
                    num=min(_PAGE, limit - len(found)),
                    withscores=True,
                )
                entries = _scored(page)
                if not entries:
                    break
                start += len(entries)
                pipe = bound.client.pipeline(transaction=False)
                for run_id, _ in entries:
                    latest, lease = self._keys(run_id, ("latest", "lease"))
                    pipe.hmget(latest, ["status", "saved_at"])
                    pipe.exists(lease)
                replies: list[Any] = await pipe.execute()
            for i, (run_id, score) in enumerate(entries):
                (status, saved_at), held = replies[2 * i], replies[2 * i + 1]
                if status is None:
                    if score < time.time() - STALE_AFTER_S:
                        stale.append((run_id, score))
                elif _text(status) in chosen and float(saved_at) < before and not held:
                    found.append(run_id)
        if stale:
            async with self._clients.use() as bound:
                await self._index.forget(bound, self._every, stale)
        return found[: max(limit, 0)]

    async def prune(self, run_ids: Sequence[str], before: float, statuses: Collection[str]) -> Pruned:
        """Delete the runs that still qualify, whole: one script per run (see the module docstring)."""
        chosen = check_prune_statuses(statuses)
        unique = list(dict.fromkeys(run_ids))
        total = Pruned((), 0)
        for start in range(0, len(unique), _PAGE):
            async with self._clients.use() as bound:
                total += await self._prune_chunk(bound, unique[start : start + _PAGE], before, chosen)
        return total

    async def _prune_chunk(self, bound: Bound, run_ids: list[str], before: float, chosen: Sequence[str]) -> Pruned:
        pipe = bound.client.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hget(self._keys(run_id, ("latest",))[0], "flow")
        flows = [(run_id, _text(flow)) for run_id, flow in zip(run_ids, await pipe.execute(), strict=True) if flow]
        script = bound.scripts["prune_run"]

        def call(run_id: str, flow: str, client: Any = None) -> Any:
            keys = self._keys(run_id, _PARTS) + ([] if bound.cluster else self._index.keys(flow))
            return script(keys=keys, args=[repr(before), run_id, flow, *chosen], client=client)

        if bound.cluster:  # each script to its slot's node, a bounded number at a time
            gate = asyncio.Semaphore(_CLUSTER_CALLS)

            async def gated(run_id: str, flow: str) -> Any:
                async with gate:
                    return await call(run_id, flow)

            replies = await asyncio.gather(*(gated(run_id, flow) for run_id, flow in flows))
        else:  # one round trip: the scripts in one pipeline
            pipe = bound.client.pipeline(transaction=False)
            for run_id, flow in flows:
                await call(run_id, flow, pipe)
            replies = await pipe.execute()
        pruned, rows, entries = [], 0, []
        for (run_id, flow), reply in zip(flows, replies, strict=True):
            if _text(reply[0]) == "pruned":
                pruned.append(run_id)
                rows += int(reply[1])
                entries.append((run_id, flow, float(reply[2])))
        if bound.cluster and entries:
            await self._unlist(bound, entries)
        return Pruned(tuple(pruned), rows)

    async def _unlist(self, bound: Bound, entries: list[tuple[str, str, float]]) -> None:
        """On Cluster: remove pruned runs from the indexes (an entry re-added since, by a new run, stays)."""
        by_flow: dict[str, list[tuple[str, float]]] = {}
        for run_id, flow, saved_at in entries:
            by_flow.setdefault(flow, []).append((run_id, saved_at))
        await self._index.forget(bound, self._every, [entry for found in by_flow.values() for entry in found])
        for flow, found in by_flow.items():
            _, of_flow, unfinished = self._index.keys(flow)
            await self._index.forget(bound, of_flow, found)
            await bound.client.zrem(unfinished, *(run_id for run_id, _ in found))
