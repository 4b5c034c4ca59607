"""Retention of `RedisCheckpointStore`: find finished runs by the time index, delete them whole or trim them.

`prunable` and `trimmable` read ``P:runs`` (run id -> saved_at of its newest save) from the
oldest entry (or the caller's cursor) up to the cut-off, a page at a time, and check each
run's latest hash and lease key (and for a trim, the entry before its newest checkpoint) in
one pipelined round trip per page: a run qualifies when its status is one of the chosen
ones, its saved_at is before the cut-off and no lease key exists (it expires when the lease
lapses); a trim also wants a run that is not a tool loop and still has an older row. An
entry whose run has no keys left (expired by its TTL, deleted) is removed from ``P:runs``
as the listings remove it (`Index.forget`, only `STALE_AFTER_S` after its score). No KEYS
and no SCAN: the index is sorted by time.

`prune` reads the flow of each run asked for (one pipelined round trip per chunk), then
runs ``_lua/prune_run.lua`` for each, which judges the run again and deletes its six keys
in one step (no live lease: the script runs while nobody else can take one). Given the
rows the caller judged (`JudgedRows`), the script also reads the run's last checkpoint row
(the end of its list, not the latest hash, whose fields in clear anyone can set) and
deletes the run only if that row's header names the judged step and signature: a save
that landed after the judgement appended another row, and the run stays. On one server
the scripts also remove the run from the three indexes, and a chunk's scripts go in one
pipeline. On Redis Cluster each run's script goes to its slot's node (concurrently), and
the index entries, in other slots, are removed afterwards: an entry left by a prune cut
off there names a run with no keys, which every listing skips and removes.

Both scripts also leave a run while one of its markers that say it is live exists (a
cancel request: `rules.LIVE_MARKERS`, kept in the run's slot), and while its call log
holds a record the judged row does not account for (``beyond`` in ``_lua/newest.lua``: a
segment newer than the row's, or more records in a segment than it counted): a run whose
retry's rows were popped off its list (RPOP), its latest hash and index set back (HSET,
ZADD), still has the retry's records, so it stays, and the run is reported
(`Pruned.refused`, worded by `rules.beyond_problem`).

`trim` runs ``_lua/trim_run.lua`` for each run, which judges it again (the judged row
too, as the prune script does) and blanks every checkpoint row but the newest in one step;
it touches only the run's own keys, so it is the same script on one server and on a
Cluster, and no index entry changes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

from agentflow.exec.checkpoints.records import JudgedRow, JudgedRows, Pruned, Trimmed
from agentflow.exec.checkpoints.redis._index import STALE_AFTER_S, Index
from agentflow.exec.checkpoints.redis._rows import _scored, _text
from agentflow.exec.checkpoints.redis.clients import MAX_PIPELINE, Bound, LoopClients
from agentflow.exec.checkpoints.rules import (
    UNTRIMMED_PREFIX,
    beyond_problem,
    check_judged,
    check_prune_statuses,
    live_marker_keys,
    trims,
)

#: Index entries read per page, and runs pruned per pipeline.
_PAGE: Final = MAX_PIPELINE
#: Scripts in flight at once on a Cluster (each on its own connection).
_CLUSTER_CALLS: Final = 32
#: The run's keys the prune script takes, in its KEYS order.
_PARTS: Final = ("cp", "latest", "calls", "next", "lease", "events", "packed")
#: The run's keys the trim script takes, in its KEYS order.
_TRIM_PARTS: Final = ("cp", "latest", "lease", "calls")


class RedisPrune:
    """Retention under one prefix; `run_keys(run_id, parts)` names a run's keys (and checks the id)."""

    def __init__(
        self,
        clients: LoopClients,
        index: Index,
        prefix: str,
        run_keys: Callable[..., list[str]],
        marker_key: Callable[[str], str],
    ) -> None:
        self._clients = clients
        self._index = index
        self._every = f"{prefix}:runs"
        self._keys = run_keys
        self._marker_key = marker_key

    def _markers(self, run_id: str) -> list[str]:
        """The keys of the run's markers that say it is live (`rules.live_marker_keys`), in its slot."""
        return [self._marker_key(key) for key in live_marker_keys(run_id)]

    async def prunable(self, before: float, statuses: Collection[str], limit: int) -> list[str]:
        """The runs a prune would take now, oldest first (see the module docstring)."""
        found = await self._find(before, set(check_prune_statuses(statuses)), limit, None, trim=False)
        return [run_id for run_id, _ in found]

    async def trimmable(
        self, before: float, statuses: Collection[str], limit: int, since: float | None
    ) -> list[tuple[str, float]]:
        """The runs a trim would take now, ``(run_id, saved_at)`` oldest first (see the module docstring)."""
        return await self._find(before, set(check_prune_statuses(statuses, "a trim")), limit, since, trim=True)

    async def _find(
        self, before: float, chosen: set[str], limit: int, since: float | None, *, trim: bool
    ) -> list[tuple[str, float]]:
        """Walk ``P:runs`` from `since` (or the oldest) to the cut-off; the runs a prune (or a trim) would take."""
        found: list[tuple[str, float]] = []
        stale: list[tuple[str, float]] = []
        start, low, width = 0, "-inf" if since is None else repr(since), 3 if trim else 2
        while len(found) < limit:
            async with self._clients.use() as bound:
                size = min(_PAGE // width, limit - len(found))  # `width` commands a run: one pipeline a page
                page = await bound.client.zrangebyscore(
                    self._every, low, f"({before!r}", start=start, num=size, withscores=True
                )
                entries = _scored(page)
                if not entries:
                    break
                start += len(entries)
                pipe = bound.client.pipeline(transaction=False)
                for run_id, _ in entries:
                    cp, latest, lease = self._keys(run_id, ("cp", "latest", "lease"))
                    pipe.hmget(latest, ["status", "saved_at", "flow"])
                    pipe.exists(lease)
                    if trim:
                        pipe.lindex(cp, -2)  # the row before the newest: None or blank when nothing is left to trim
                replies: list[Any] = await pipe.execute()
            for i, (run_id, score) in enumerate(entries):
                (status, saved_at, flow), held, *older = replies[width * i : width * (i + 1)]
                if status is None:
                    if score < time.time() - STALE_AFTER_S:
                        stale.append((run_id, score))
                elif _text(status) in chosen and float(saved_at) < before and not held:
                    if not trim or (trims(_text(flow)) and bool(older[0])):
                        found.append((run_id, score))
        if stale:
            async with self._clients.use() as bound:
                await self._index.forget(bound, self._every, stale)
        return found[: max(limit, 0)]

    async def prune(
        self, run_ids: Sequence[str], before: float, statuses: Collection[str], judged: JudgedRows | None
    ) -> Pruned:
        """Delete the runs that still qualify, whole: one script per run (see the module docstring)."""
        chosen = check_prune_statuses(statuses)
        pinned = check_judged(judged)
        unique = [run_id for run_id in dict.fromkeys(run_ids) if pinned is None or run_id in pinned]
        total = Pruned((), 0)
        for start in range(0, len(unique), _PAGE):
            async with self._clients.use() as bound:
                total += await self._prune_chunk(bound, unique[start : start + _PAGE], before, chosen, pinned)
        return total

    async def trim(
        self, run_ids: Sequence[str], before: float, statuses: Collection[str], judged: JudgedRows | None
    ) -> Trimmed:
        """Keep only the newest checkpoint of the runs that still qualify: one script per run (module docstring)."""
        chosen = check_prune_statuses(statuses, "a trim")
        pinned = check_judged(judged)
        unique = [run_id for run_id in dict.fromkeys(run_ids) if pinned is None or run_id in pinned]
        trimmed: list[str] = []
        problems: list[tuple[str, str]] = []
        rows = 0
        for start in range(0, len(unique), _PAGE):
            chunk = unique[start : start + _PAGE]
            async with self._clients.use() as bound:
                calls = [
                    (
                        self._keys(run_id, _TRIM_PARTS) + self._markers(run_id),
                        [
                            repr(before),
                            UNTRIMMED_PREFIX,
                            *_mark(pinned, run_id),
                            *_count(self._markers(run_id)),
                            *chosen,
                        ],
                    )
                    for run_id in chunk
                ]
                replies = await _run_scripts(bound, "trim_run", calls)
            for run_id, reply in zip(chunk, replies, strict=True):
                if _text(reply[0]) == "trimmed":
                    trimmed.append(run_id)
                    rows += int(reply[1])
                else:
                    _beyond(run_id, pinned, reply, problems)
        return Trimmed(tuple(trimmed), rows, tuple(problems))

    async def _prune_chunk(
        self,
        bound: Bound,
        run_ids: list[str],
        before: float,
        chosen: Sequence[str],
        pinned: dict[str, JudgedRow] | None,
    ) -> Pruned:
        pipe = bound.client.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hget(self._keys(run_id, ("latest",))[0], "flow")
        flows = [(run_id, _text(flow)) for run_id, flow in zip(run_ids, await pipe.execute(), strict=True) if flow]
        calls = [
            (
                self._keys(run_id, _PARTS) + self._markers(run_id) + ([] if bound.cluster else self._index.keys(flow)),
                [repr(before), run_id, flow, *_mark(pinned, run_id), *_count(self._markers(run_id)), *chosen],
            )
            for run_id, flow in flows
        ]
        replies = await _run_scripts(bound, "prune_run", calls)
        pruned, rows, entries = [], 0, []
        problems: list[tuple[str, str]] = []
        for (run_id, flow), reply in zip(flows, replies, strict=True):
            if _text(reply[0]) == "pruned":
                pruned.append(run_id)
                rows += int(reply[1])
                entries.append((run_id, flow, float(reply[2])))
            else:
                _beyond(run_id, pinned, reply, problems)
        if bound.cluster and entries:
            await self._unlist(bound, entries)
        return Pruned(tuple(pruned), rows, tuple(problems))

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


def _mark(pinned: dict[str, JudgedRow] | None, run_id: str) -> tuple[str, str, str, str]:
    """The script arguments that pin a run to its judged newest row (blank: none judged, or not known).

    Its step and signature; its signed segment (blank: the script reads the stored row's);
    and the records per segment it accounts for, as JSON pairs (blank: unknown, segments only).
    """
    if pinned is None:
        return "", "", "", ""
    mark = pinned[run_id]
    segment = "" if mark.segment is None else str(mark.segment)
    counts = "" if mark.counts is None else json.dumps([list(pair) for pair in mark.counts])
    return str(mark.step), mark.sig, segment, counts


def _count(keys: Sequence[str]) -> tuple[str]:
    """The script argument that says how many marker keys follow the run's own."""
    return (str(len(keys)),)


def _beyond(
    run_id: str, pinned: dict[str, JudgedRow] | None, reply: Sequence[Any], problems: list[tuple[str, str]]
) -> None:
    """Add the run's problem to `problems` when its script left it because its log goes on past the row judged."""
    if len(reply) == 6 and _text(reply[1]) == "beyond":
        segment, found, records, accounted = (int(v) for v in reply[2:])
        step = pinned[run_id].step if pinned is not None else -1
        problems.append((run_id, beyond_problem(step, segment, found, records, None if accounted < 0 else accounted)))


async def _run_scripts(bound: Bound, name: str, calls: Sequence[tuple[list[str], list[str]]]) -> list[Any]:
    """Run script `name` once per ``(keys, args)``: pipelined on one server, each to its node on a Cluster."""
    script = bound.scripts[name]
    if bound.cluster:  # each script to its slot's node, a bounded number at a time
        gate = asyncio.Semaphore(_CLUSTER_CALLS)

        async def gated(keys: list[str], args: list[str]) -> Any:
            async with gate:
                return await script(keys=keys, args=args)

        return list(await asyncio.gather(*(gated(keys, args) for keys, args in calls)))
    pipe: Any = bound.client.pipeline(transaction=False)  # one round trip: the scripts in one pipeline
    for keys, args in calls:
        await script(keys=keys, args=args, client=pipe)
    return list(await pipe.execute())
