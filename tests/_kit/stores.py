"""Every store set-up a test can run on, each over fresh storage of its own, removed afterwards.

Set-ups (their pytest ids): ``memory``, ``sqlite``, ``fakeredis``, ``redis`` (the real server,
marked ``redis``), ``sql-sqlite`` (SQLAlchemy on aiosqlite) and ``sql-postgres`` (SQLAlchemy on
the real PostgreSQL, marked ``postgres``). Isolation is the one tests/checkpoints/store_setups.py
uses: a new file under ``tmp_path``, a new Redis key prefix, a new table prefix in PostgreSQL
(never ``FLUSHALL``, never a shared table).

Fixtures (registered in tests/conftest.py):
- ``store_setup``: a `StoreSetup` per set-up of `ENGINE_SETUPS` (four of the six ids above;
  ``setups()`` names all six). ``setup.open()`` is a new store
  object over the same storage (a new "worker"), ``setup.raw`` the one a test reads rows with,
  ``setup.rows`` raw access behind the store's back (tamper tests), ``setup.spec`` what a
  subprocess opens (`_kit.specs.open_spec`; None for memory and fakeredis).
- ``any_store``: ``store_setup.raw``, for a test that needs just one store per set-up.
- ``shared_spec``: the spec string of a set-up another process can open (`SHARED_SETUPS`),
  for tests whose workers are subprocesses; the storage is removed afterwards.

To run on a subset, parametrize the fixture indirectly::

    @pytest.mark.parametrize("store_setup", setups("sqlite", "redis"), indirect=True)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from _kit.specs import child_env, open_spec
from agentflow.exec.checkpoints import CheckpointStore, MemoryCheckpointStore, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.records import Marker, stored_fields
from agentflow.exec.checkpoints.redis._events import _pack, _unpack

#: Every set-up, by pytest id.
ALL_SETUPS = ("memory", "sqlite", "fakeredis", "redis", "sql-sqlite", "sql-postgres")
#: The set-ups another process can open from a spec string (a file or a server).
SHARED_SETUPS = ("sqlite", "redis", "sql-sqlite", "sql-postgres")
#: One set-up per storage code path, the default of `store_setup`: the memory store's dicts, the
#: SQLite file store, the Redis scripts, the SQL store (on PostgreSQL, with its server-side
#: functions). The other two run code these four already run: fakeredis the same Lua scripts as
#: the real server, SQLAlchemy on aiosqlite the SQL store's SQLite path, which the conformance
#: suite and the crash kit check on their own. Store-level tests (rows, tampering, the kit's
#: `Rows`) still run on all six: they parametrize with ``setups()``.
ENGINE_SETUPS = ("memory", "sqlite", "redis", "sql-postgres")
__all__ = [  # with the spec helpers of `_kit.specs`, re-exported
    "ALL_SETUPS",
    "ENGINE_SETUPS",
    "SERVER_SETUPS",
    "SHARED_SETUPS",
    "Rows",
    "StoreSetup",
    "any_store",
    "child_env",
    "open_spec",
    "setups",
    "shared_spec",
    "store_setup",
]

#: The set-ups on a real server.
SERVER_SETUPS = ("redis", "sql-postgres")
_MARKS = {"redis": pytest.mark.redis, "sql-postgres": pytest.mark.postgres}


def setups(*names: str) -> list[Any]:
    """`pytest.param`s for the named set-ups (all when none is named), with their ids and server marks."""
    unknown = set(names) - set(ALL_SETUPS)
    if unknown:
        raise ValueError(f"unknown store set-ups {sorted(unknown)}; known: {ALL_SETUPS}")
    return [pytest.param(name, id=name, marks=_MARKS.get(name, ())) for name in names or ALL_SETUPS]


# -- raw rows -------------------------------------------------------------------------------


class Rows:
    """A set-up's rows, changed behind the store's back the way someone with write access to it could.

    ``put_*`` overwrite one row in place (its run, step or segment and seq stay its address),
    leaving every index as it was. ``drop_*`` delete one row and, like a careful attacker, tidy
    what a store keeps beside it: a segment's record count (Redis), the run's latest pointer
    (the ``runs`` row of the SQL stores, the ``latest`` hash of Redis).
    """

    #: Whether the store keeps a listing index apart from the rows (`drop_listing` applies).
    has_listing = True

    async def put_call(self, at: SealedCall, new: SealedCall) -> None:
        """Overwrite the record stored at `at`'s place (run, segment, seq) with every field of `new`."""
        raise NotImplementedError

    async def drop_call(self, at: SealedCall) -> None:
        """Delete one call record."""
        raise NotImplementedError

    async def put_checkpoint(self, at: SealedCheckpoint, new: SealedCheckpoint) -> None:
        """Overwrite the checkpoint stored at `at`'s place (run, step) with every field of `new`."""
        raise NotImplementedError

    async def drop_checkpoint(self, at: SealedCheckpoint) -> None:
        """Delete one checkpoint; the run's latest pointer then names the newest one left."""
        raise NotImplementedError

    async def drop_listing(self, run_id: str) -> None:
        """Remove the run from the store's listing index only (its rows stay)."""
        raise NotImplementedError

    async def break_checkpoint(self, at: SealedCheckpoint) -> None:
        """Overwrite the checkpoint at `at`'s place with something the store cannot even decode (not a row)."""
        raise NotImplementedError

    async def set_clear(self, run_id: str, status: str, saved_at: float) -> None:
        """Set every field the store keeps in clear about the run's newest checkpoint to `status` and `saved_at`.

        What a writer without the key can do: the listing (Redis ``latest`` hash and index
        scores, the SQL ``runs`` row) and, where the row's status and time are columns of
        their own (SQL), those columns too; a Redis row's header is left as written. The
        memory store keeps no field apart from its rows: its newest row is replaced with
        those two fields changed (its signature then no longer checks).
        """
        raise NotImplementedError

    async def hide_after(self, run_id: str, step: int) -> None:
        """Make checkpoint `step` look the run's newest with no DEL or DELETE: the later rows are moved aside.

        The probe's writes: SQL sets the later rows' steps back by 1000 (one UPDATE) and points
        the ``runs`` row at `step` (another); Redis pops the later rows (RPOP), sets the latest
        hash from row `step`'s header (HSET) and the indexes' scores to its saved_at (ZADD);
        the memory store drops them from its list. Call records are not touched.
        """
        raise NotImplementedError

    async def stored_bytes(self) -> bytes:
        """Every byte the set-up holds (files, keys or table rows), to search for what must not be stored."""
        raise NotImplementedError

    async def counts(self, run_id: str) -> tuple[int, int]:
        """How many checkpoints and call records of the run are stored (read raw: no check can refuse)."""
        raise NotImplementedError

    async def put_marker(self, key: str, value: str, token: str, expires_at: float) -> None:
        """Write marker `key` (``<kind>/<subject>``) as stored, to lapse at `expires_at`, over whatever stands."""
        raise NotImplementedError


class MemoryRows(Rows):
    """The memory store's dicts (its private attributes: tests only)."""

    def __init__(self, store: MemoryCheckpointStore) -> None:
        self.store = store

    def _segment(self, at: SealedCall) -> list[SealedCall]:
        segment: list[SealedCall] = self.store._calls[at.run_id][at.segment]
        return segment

    async def put_marker(self, key: str, value: str, token: str, expires_at: float) -> None:
        self.store._markers[key] = Marker(key, value, token, expires_at)

    def _checkpoints(self, run_id: str) -> list[SealedCheckpoint]:
        rows: list[SealedCheckpoint] = self.store._checkpoints[run_id]
        return rows

    async def put_call(self, at: SealedCall, new: SealedCall) -> None:
        seg = self._segment(at)
        seg[next(i for i, r in enumerate(seg) if r.seq == at.seq)] = new

    async def drop_call(self, at: SealedCall) -> None:
        seg = self._segment(at)
        seg.remove(next(r for r in seg if r.seq == at.seq))

    async def put_checkpoint(self, at: SealedCheckpoint, new: SealedCheckpoint) -> None:
        rows = self._checkpoints(at.run_id)
        rows[next(i for i, r in enumerate(rows) if r.step == at.step)] = new

    async def drop_checkpoint(self, at: SealedCheckpoint) -> None:
        rows = self._checkpoints(at.run_id)
        rows.remove(next(r for r in rows if r.step == at.step))

    async def drop_listing(self, run_id: str) -> None:
        self.store._listed.pop(run_id)

    async def set_clear(self, run_id: str, status: str, saved_at: float) -> None:
        rows = self._checkpoints(run_id)
        rows[-1] = dataclasses.replace(rows[-1], status=status, saved_at=saved_at)

    async def hide_after(self, run_id: str, step: int) -> None:
        del self._checkpoints(run_id)[step + 1 :]

    async def counts(self, run_id: str) -> tuple[int, int]:
        segments = self.store._calls.get(run_id, {})
        return len(self.store._checkpoints.get(run_id, [])), sum(len(seg) for seg in segments.values())

    async def stored_bytes(self) -> bytes:
        rows: list[Any] = [r for rs in self.store._checkpoints.values() for r in rs]
        rows += [r for segs in self.store._calls.values() for seg in segs.values() for r in seg]
        return b"\n".join(repr(r).encode() + b"\n" + r.payload for r in rows)


class SqlRows(Rows):
    """The tables of the SQLite store (no prefix) or of the SQLAlchemy store (``table_prefix``)."""

    def __init__(
        self,
        run_sql: Callable[[str, Sequence[Any]], Any],
        prefix: str = "",
        *,
        runs_segment: bool,
        files: Sequence[Path] = (),
    ) -> None:
        self._run = run_sql  # async (sql with ? placeholders, params) -> (rowcount, rows)
        self.cp, self.calls, self.runs = f"{prefix}checkpoints", f"{prefix}calls", f"{prefix}runs"
        self.markers = f"{prefix}markers"
        self.runs_segment = runs_segment
        self.files = files

    async def _exec(self, sql: str, *params: Any) -> tuple[int, list[tuple[Any, ...]]]:
        changed, rows = await self._run(sql, params)
        return changed, rows

    async def _one(self, sql: str, *params: Any) -> None:
        changed, _ = await self._exec(sql, *params)
        assert changed == 1, (sql, params, changed)

    async def execute(self, sql: str, *params: Any) -> int:
        """Run one statement on the tables with the writer's grants (``{cp}``, ``{calls}``, ``{runs}``: their names).

        Returns:
            How many rows it changed.
        """
        changed, _ = await self._exec(sql.format(cp=self.cp, calls=self.calls, runs=self.runs), *params)
        return changed

    async def put_call(self, at: SealedCall, new: SealedCall) -> None:
        await self._one(
            f"UPDATE {self.calls} SET run_id=?, segment=?, seq=?, kind=?, payload=?, kid=?, sig=? "
            "WHERE run_id=? AND segment=? AND seq=?",
            *(getattr(new, f.name) for f in stored_fields(SealedCall)),
            at.run_id,
            at.segment,
            at.seq,
        )

    async def put_marker(self, key: str, value: str, token: str, expires_at: float) -> None:
        await self._exec(f"DELETE FROM {self.markers} WHERE key=?", key)
        sql = f"INSERT INTO {self.markers} (key, value, token, expires_at) VALUES (?, ?, ?, ?)"
        await self._one(sql, key, value, token, expires_at)

    async def drop_call(self, at: SealedCall) -> None:
        sql = f"DELETE FROM {self.calls} WHERE run_id=? AND segment=? AND seq=?"
        await self._one(sql, at.run_id, at.segment, at.seq)

    async def put_checkpoint(self, at: SealedCheckpoint, new: SealedCheckpoint) -> None:
        await self._one(
            f"UPDATE {self.cp} SET run_id=?, step=?, flow=?, status=?, segment=?, saved_at=?, payload=?, kid=?, sig=? "
            "WHERE run_id=? AND step=?",
            *dataclasses.astuple(new),
            at.run_id,
            at.step,
        )

    async def drop_checkpoint(self, at: SealedCheckpoint) -> None:
        await self._one(f"DELETE FROM {self.cp} WHERE run_id=? AND step=?", at.run_id, at.step)
        _, rows = await self._exec(
            f"SELECT step, flow, status, segment, saved_at FROM {self.cp} WHERE run_id=? ORDER BY step DESC LIMIT 1",
            at.run_id,
        )
        if not rows:
            await self._exec(f"DELETE FROM {self.runs} WHERE run_id=?", at.run_id)
            return
        step, flow, status, segment, saved_at = rows[0]
        if self.runs_segment:
            sql = f"UPDATE {self.runs} SET step=?, flow=?, status=?, segment=?, saved_at=? WHERE run_id=?"
            await self._one(sql, step, flow, status, segment, saved_at, at.run_id)
        else:
            sql = f"UPDATE {self.runs} SET step=?, flow=?, status=?, saved_at=? WHERE run_id=?"
            await self._one(sql, step, flow, status, saved_at, at.run_id)

    async def break_checkpoint(self, at: SealedCheckpoint) -> None:
        if not self.files:
            raise NotImplementedError("PostgreSQL's typed columns take no value of another type")
        await self._one(f"UPDATE {self.cp} SET payload=? WHERE run_id=? AND step=?", "not bytes", at.run_id, at.step)

    async def drop_listing(self, run_id: str) -> None:
        await self._one(f"DELETE FROM {self.runs} WHERE run_id=?", run_id)

    async def set_clear(self, run_id: str, status: str, saved_at: float) -> None:
        newest = f"(SELECT MAX(step) FROM {self.cp} WHERE run_id=?)"
        sql = f"UPDATE {self.cp} SET status=?, saved_at=? WHERE run_id=? AND step={newest}"
        await self._one(sql, status, saved_at, run_id, run_id)
        await self._one(f"UPDATE {self.runs} SET status=?, saved_at=? WHERE run_id=?", status, saved_at, run_id)

    async def hide_after(self, run_id: str, step: int) -> None:
        await self._exec(f"UPDATE {self.cp} SET step = step - 1000 WHERE run_id=? AND step > ?", run_id, step)
        _, rows = await self._exec(
            f"SELECT status, segment, saved_at FROM {self.cp} WHERE run_id=? AND step=?", run_id, step
        )
        status, segment, saved_at = rows[0]
        if self.runs_segment:
            sql = f"UPDATE {self.runs} SET step=?, status=?, segment=?, saved_at=? WHERE run_id=?"
            await self._one(sql, step, status, segment, saved_at, run_id)
        else:
            await self._one(
                f"UPDATE {self.runs} SET step=?, status=?, saved_at=? WHERE run_id=?", step, status, saved_at, run_id
            )

    async def counts(self, run_id: str) -> tuple[int, int]:
        _, checkpoints = await self._exec(f"SELECT COUNT(*) FROM {self.cp} WHERE run_id=?", run_id)
        _, calls = await self._exec(f"SELECT COUNT(*) FROM {self.calls} WHERE run_id=?", run_id)
        return int(checkpoints[0][0]), int(calls[0][0])

    async def stored_bytes(self) -> bytes:
        if self.files:  # SQLite: the database files themselves, with their -wal and -shm
            found = [p for f in self.files for p in (f, *f.parent.glob(f.name + "-*")) if p.exists()]
            return b"".join(p.read_bytes() for p in found)
        out = []
        for table in (self.cp, self.calls, self.runs):
            _, rows = await self._exec(f"SELECT * FROM {table}")
            out += [v if isinstance(v, bytes) else str(v).encode() for row in rows for v in row]
        return b"\n".join(out)


def _sqlite_runner(path: Path) -> Callable[[str, Sequence[Any]], Any]:
    async def run(sql: str, params: Sequence[Any]) -> tuple[int, list[tuple[Any, ...]]]:
        with closing(sqlite3.connect(path)) as conn, conn:
            cursor = conn.execute(sql, tuple(params))
            return cursor.rowcount, cursor.fetchall()

    return run


def _postgres_runner(dsn: str) -> Callable[[str, Sequence[Any]], Any]:
    async def run(sql: str, params: Sequence[Any]) -> tuple[int, list[tuple[Any, ...]]]:
        import asyncpg

        parts = sql.split("?")
        numbered = parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], start=1))
        conn = await asyncpg.connect(dsn)
        try:
            if numbered.lstrip().upper().startswith("SELECT"):
                return 0, [tuple(r) for r in await conn.fetch(numbered, *params)]
            status = await conn.execute(numbered, *params)  # e.g. "UPDATE 1"
            return int(status.rsplit(" ", 1)[-1]), []
        finally:
            await conn.close()

    return run


class RedisRows(Rows):
    """The Redis store's keys (layout and row format: agentflow/exec/checkpoints/redis/store.py, _redis_rows.py)."""

    def __init__(self, client: Callable[[], Any], prefix: str) -> None:
        self._client = client
        self.prefix = prefix

    def _keys(self, run_id: str) -> tuple[str, str, str, str]:
        base = f"{self.prefix}:run:{{{run_id}}}"
        return f"{base}:cp", f"{base}:latest", f"{base}:calls", f"{base}:next"

    @staticmethod
    def _row(fields: list[Any], payload: bytes) -> bytes:
        return json.dumps([1, *fields], separators=(",", ":")).encode() + b"\n" + payload

    def _call_row(self, r: SealedCall) -> bytes:
        return self._row([r.run_id, r.segment, r.seq, r.kind, r.kid, r.sig], r.payload)

    def _checkpoint_row(self, c: SealedCheckpoint) -> bytes:
        return self._row([c.run_id, c.step, c.flow, c.status, c.segment, c.saved_at, c.kid, c.sig], c.payload)

    async def _do(self, job: Callable[[Any], Any]) -> Any:
        client = self._client()
        try:
            return await job(client)
        finally:
            await client.aclose()

    async def put_call(self, at: SealedCall, new: SealedCall) -> None:
        _, _, calls, _ = self._keys(at.run_id)
        await self._do(lambda c: c.hset(calls, f"{at.segment}:{at.seq}", self._call_row(new)))

    async def drop_event(self, run_id: str, cursor: str) -> None:
        """Delete one entry of the run's stream (one XDEL), or from its packed events (packed again without it)."""
        stream, packed = (f"{self.prefix}:run:{{{run_id}}}:{part}" for part in ("events", "packed"))
        if await self._do(lambda c: c.xdel(stream, cursor)) == 1:
            return
        rows = _unpack(run_id, await self._do(lambda c: c.get(packed)))
        kept = [(i, row) for i, row in rows if i != cursor]
        assert len(kept) == len(rows) - 1, f"run {run_id!r} has no event entry {cursor}"
        await self._do(lambda c: c.set(packed, _pack(kept), keepttl=True))

    async def packed_events(self, run_id: str) -> tuple[int, bytes | None]:
        """How many entries the run's stream holds, and its packed events' value (None: not packed)."""
        stream, packed = (f"{self.prefix}:run:{{{run_id}}}:{part}" for part in ("events", "packed"))
        return await self._do(lambda c: c.xlen(stream)), await self._do(lambda c: c.get(packed))

    async def put_packed_events(self, run_id: str, value: bytes) -> None:
        """Set the run's packed events to `value` (one SET), as someone who can write to the server could."""
        packed = f"{self.prefix}:run:{{{run_id}}}:packed"
        await self._do(lambda c: c.set(packed, value))

    async def send(self, run_id: str, part: str, command: str, *args: Any) -> Any:
        """Send one command on one of the run's keys (``cp``, ``latest``, ``calls``, ``next``), as a writer could."""
        key = dict(zip(("cp", "latest", "calls", "next"), self._keys(run_id), strict=True))[part]
        return await self._do(lambda c: c.execute_command(command, key, *args))

    async def put_marker(self, key: str, value: str, token: str, expires_at: float) -> None:
        kind, _, subject = key.partition("/")
        where, ms = f"{self.prefix}:marker:{{{subject}}}:{kind}", int(expires_at * 1000)

        async def job(c: Any) -> None:
            await c.hset(where, mapping={"owner": value, "token": token, "expires_at": ms})
            await c.pexpireat(where, ms - 1)

        await self._do(job)

    async def rewind_count(self, run_id: str, segment: int, count: int) -> None:
        """Set the segment's record counter to `count` (one HSET: no record is deleted)."""
        _, _, _, counts = self._keys(run_id)
        await self._do(lambda c: c.hset(counts, str(segment), count))

    async def drop_call(self, at: SealedCall) -> None:
        _, _, calls, counts = self._keys(at.run_id)

        async def job(c: Any) -> None:
            assert await c.hdel(calls, f"{at.segment}:{at.seq}") == 1
            seqs = [int(f.split(b":")[1]) for f in await c.hkeys(calls) if f.startswith(f"{at.segment}:".encode())]
            if seqs:
                await c.hset(counts, str(at.segment), max(seqs) + 1)
            else:
                await c.hdel(counts, str(at.segment))

        await self._do(job)

    async def put_checkpoint(self, at: SealedCheckpoint, new: SealedCheckpoint) -> None:
        cp, _, _, _ = self._keys(at.run_id)
        await self._do(lambda c: c.lset(cp, at.step, self._checkpoint_row(new)))

    async def break_checkpoint(self, at: SealedCheckpoint) -> None:
        cp, _, _, _ = self._keys(at.run_id)
        await self._do(lambda c: c.lset(cp, at.step, b"not a row header\n{}"))

    async def drop_checkpoint(self, at: SealedCheckpoint) -> None:
        cp, latest, _, _ = self._keys(at.run_id)

        async def job(c: Any) -> None:
            await c.lset(cp, at.step, b"\x00dropped")
            assert await c.lrem(cp, 1, b"\x00dropped") == 1
            last = await c.lindex(cp, -1)
            if last is None:
                await c.delete(latest)
                return
            head = json.loads(last.partition(b"\n")[0])
            _, _, step, flow, status, segment, saved_at, _, _ = head
            fields = {"step": step, "flow": flow, "status": status, "segment": segment, "saved_at": repr(saved_at)}
            await c.hset(latest, mapping=fields)

        await self._do(job)

    async def drop_listing(self, run_id: str) -> None:
        _, latest, _, _ = self._keys(run_id)

        async def job(c: Any) -> None:
            flow = (await c.hget(latest, "flow")).decode()
            for index in (f"{self.prefix}:runs", f"{self.prefix}:runs:{flow}", f"{self.prefix}:unfinished:{flow}"):
                await c.zrem(index, run_id)

        await self._do(job)

    async def set_clear(self, run_id: str, status: str, saved_at: float) -> None:
        _, latest, _, _ = self._keys(run_id)

        async def job(c: Any) -> None:
            await c.hset(latest, mapping={"status": status, "saved_at": repr(saved_at)})
            flow = (await c.hget(latest, "flow")).decode()
            for index in (f"{self.prefix}:runs", f"{self.prefix}:runs:{flow}"):
                if await c.zscore(index, run_id) is not None:
                    await c.zadd(index, {run_id: saved_at})
            if status not in ("running", "paused"):
                await c.zrem(f"{self.prefix}:unfinished:{flow}", run_id)

        await self._do(job)

    async def hide_after(self, run_id: str, step: int) -> None:
        cp, latest, _, _ = self._keys(run_id)

        async def job(c: Any) -> None:
            for _ in range(int(await c.llen(cp)) - step - 1):
                await c.rpop(cp)
            head = json.loads((await c.lindex(cp, -1)).partition(b"\n")[0])
            _, _, at, flow, status, segment, saved_at, _, _ = head
            fields = {"step": at, "flow": flow, "status": status, "segment": segment, "saved_at": repr(saved_at)}
            await c.hset(latest, mapping=fields)
            for index in (f"{self.prefix}:runs", f"{self.prefix}:runs:{flow}"):
                await c.zadd(index, {run_id: saved_at})

        await self._do(job)

    async def counts(self, run_id: str) -> tuple[int, int]:
        cp, _, calls, _ = self._keys(run_id)

        async def job(c: Any) -> tuple[int, int]:
            return int(await c.llen(cp)), int(await c.hlen(calls))

        found: tuple[int, int] = await self._do(job)
        return found

    async def stored_bytes(self) -> bytes:
        async def job(c: Any) -> bytes:
            out: list[bytes] = []
            async for key in c.scan_iter(match=f"{self.prefix}*", count=500):
                kind = (await c.type(key)).decode()
                out.append(key)
                if kind == "string":
                    out.append(await c.get(key))
                elif kind == "list":
                    out += await c.lrange(key, 0, -1)
                elif kind == "hash":
                    out += [part for pair in (await c.hgetall(key)).items() for part in pair]
                elif kind == "zset":
                    out += await c.zrange(key, 0, -1)
                elif kind == "set":
                    out += list(await c.smembers(key))
            return b"\n".join(v if isinstance(v, bytes) else str(v).encode() for v in out)

        result: bytes = await self._do(job)
        return result


# -- set-ups --------------------------------------------------------------------------------


@dataclasses.dataclass
class Backing:
    """The storage of one set-up: how to open stores on it, its raw rows, and how to remove it."""

    name: str
    make: Callable[[], CheckpointStore]
    rows: Rows
    spec: str | None
    remove: Callable[[], None] = lambda: None


def _in_thread(job: Callable[[], Any]) -> Any:
    """``asyncio.run(job())`` on a thread of its own (safe while an event loop runs on this one)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(job())).result()


def _remove_redis_keys(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:  # only this test's keys: never FLUSHALL a server others use
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


def _remove_postgres_tables(dsn: str, table_prefix: str) -> None:
    async def drop() -> None:
        import asyncpg

        conn = await asyncpg.connect(dsn)
        try:
            tables = await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)",
                table_prefix,
            )
            for row in tables:
                await conn.execute(f'DROP TABLE IF EXISTS "{row["tablename"]}" CASCADE')
        finally:
            await conn.close()

    _in_thread(drop)


def backing(name: str, request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Backing:
    """Fresh storage for set-up `name` (`prefix`: unique to the test, ``t`` and hex digits)."""
    from agentflow.exec.checkpoints import SQLiteCheckpointStore

    if name == "memory":
        shared = MemoryCheckpointStore()  # the data lives in the object: every "worker" shares it
        return Backing(name, lambda: shared, MemoryRows(shared), None)
    if name == "sqlite":
        path = tmp_path / f"{prefix}.db"
        rows = SqlRows(_sqlite_runner(path), runs_segment=False, files=[path])
        return Backing(name, lambda: SQLiteCheckpointStore(path), rows, f"sqlite:{path}")
    if name in ("fakeredis", "redis"):
        import redis.asyncio

        from agentflow.exec.checkpoints import RedisCheckpointStore

        if name == "fakeredis":
            import fakeredis

            server = fakeredis.FakeServer()  # every client the store makes talks to this one server

            def client() -> Any:
                return fakeredis.FakeAsyncRedis(server=server)

            spec, remove = None, (lambda: None)
        else:
            url: str = request.getfixturevalue("redis_url")

            def client() -> Any:
                return redis.asyncio.Redis.from_url(url)

            spec = f"redis:{url}#{prefix}"

            def remove() -> None:
                _remove_redis_keys(url, prefix)

        return Backing(
            name, lambda: RedisCheckpointStore(client, prefix=prefix), RedisRows(client, prefix), spec, remove
        )
    if name in ("sql-sqlite", "sql-postgres"):
        from agentflow.exec.checkpoints import SQLAlchemyCheckpointStore

        table_prefix = f"{prefix}_"
        if name == "sql-sqlite":
            path = tmp_path / f"{prefix}-sql.db"
            url = f"sqlite+aiosqlite:///{path}"
            rows = SqlRows(_sqlite_runner(path), table_prefix, runs_segment=True, files=[path])
            remove = lambda: None  # noqa: E731 (the file goes with tmp_path)
        else:
            url = request.getfixturevalue("postgres_url")
            dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
            rows = SqlRows(_postgres_runner(dsn), table_prefix, runs_segment=True)

            def remove() -> None:
                _remove_postgres_tables(dsn, table_prefix)

        spec = f"sql:{url}#{table_prefix}"
        return Backing(name, lambda: SQLAlchemyCheckpointStore(url, table_prefix=table_prefix), rows, spec, remove)
    raise ValueError(f"unknown store set-up {name!r}; known: {ALL_SETUPS}")


@dataclasses.dataclass
class StoreSetup:
    """One set-up under test: stores over shared storage, and that storage's raw rows."""

    name: str
    """The set-up's id: one of `ALL_SETUPS`."""
    spec: str | None
    """What `open_spec` opens in another process (None: memory and fakeredis live in this one)."""
    rows: Rows
    """The rows behind the store's back, for tamper tests."""
    make: Callable[[], CheckpointStore]
    opened: list[CheckpointStore] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.raw = self.open()
        """The store a test reads rows through (never wrapped)."""

    def open(self) -> CheckpointStore:
        """A new store object over the same storage (one per "worker"); memory: the one shared object."""
        store = self.make()
        if store not in self.opened:
            self.opened.append(store)
        return store

    async def aclose(self) -> None:
        """Close every store this set-up opened."""
        for store in self.opened:
            await store.aclose()

    async def calls(self, run_id: str) -> list[SealedCall]:
        """The run's call records as stored."""
        return list(await self.raw.calls(run_id))

    async def history(self, run_id: str) -> list[SealedCheckpoint]:
        """The run's checkpoints as stored."""
        return list(await self.raw.history(run_id))


@pytest.fixture(params=setups(*ENGINE_SETUPS))
async def store_setup(
    request: pytest.FixtureRequest, tmp_path: Path, unique_prefix: Callable[[], str]
) -> AsyncIterator[StoreSetup]:
    """Each set-up of `ENGINE_SETUPS` in turn (unless a test names others) over fresh storage.

    Every store it opened is closed and the storage removed afterwards.
    """
    found = backing(request.param, request, tmp_path, unique_prefix())
    setup = StoreSetup(found.name, found.spec, found.rows, found.make)
    try:
        yield setup
    finally:
        try:
            await setup.aclose()
        finally:
            found.remove()


@pytest.fixture
def any_store(store_setup: StoreSetup) -> CheckpointStore:
    """An empty store of each set-up in turn (`store_setup` closes it)."""
    return store_setup.raw


@pytest.fixture(params=setups(*SHARED_SETUPS))
def shared_spec(request: pytest.FixtureRequest, tmp_path: Path, unique_prefix: Callable[[], str]) -> Iterator[str]:
    """The spec of a set-up that worker subprocesses open (`open_spec`); the storage is removed afterwards."""
    if request.param not in SHARED_SETUPS:
        raise ValueError(f"{request.param!r} cannot be opened from another process; use one of {SHARED_SETUPS}")
    found = backing(request.param, request, tmp_path, unique_prefix())
    assert found.spec is not None
    try:
        yield found.spec
    finally:
        found.remove()


async def run_sql(url: str, statement: str) -> None:
    """Run one SQL statement on the database at SQLAlchemy URL `url` (behind any store's back), in a transaction."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()
