"""The PostgreSQL fast path of `SQLAlchemyCheckpointStore`: every hot operation is one round trip.

A superstep's writes (a call record; the ``done`` record with the checkpoint), the lease
operations and the reads a run makes each send one statement, in autocommit (PostgreSQL
runs a lone statement in a transaction of its own), on the asyncpg connection under a
pooled SQLAlchemy connection (`Connector.driver`), through asyncpg's own prepared-statement
cache. Measured before: three to five round trips per operation (``BEGIN``, the statements,
``COMMIT``) and about 80 µs of SQLAlchemy per statement and 150 µs per pool checkout.

Where a write must lock a row and then read what others committed before the lock was
granted, it is a PL/pgSQL function the store installs with its tables (migration 4): a
VOLATILE function takes a fresh snapshot for each statement it runs, so its count of a
segment's records, made after ``SELECT ... FOR UPDATE`` on the run's ``runs`` row, sees
every record the previous holder of the lock committed: what the store's two-statement
transaction did before, in one round trip.

- ``<prefix>write``: a call record (``p_step`` NULL), a save, or records then a save, all
  or nothing. It applies the numbering, fencing and compare-and-set rules (`rules`) to
  what it read and writes only if they pass; otherwise it writes nothing and returns what
  it read, and `PgFastPath.write` runs `rules` on that to raise the same error, with the
  same message, as every other store. A step 0 reads the ``runs`` row without a lock and
  refuses to start over stored rows; two writers of one step 0 meet at the primary key.
- ``<prefix>write_moving`` (migration 6): ``write``, and the run's lease moved with it
  (`LeaseMoving`): the lease row is locked and `LeaseMove`'s rule judged first (another
  token's live lease: nothing is written, its holder is returned), then ``write``, then the
  lease given up or handed on, only if ``write`` wrote.
- ``<prefix>take_lease``: the leases module's upsert, then the row read back under the
  lock the upsert took (on the conflicting row too, when its ``WHERE`` failed).
- ``<prefix>release_lease``: the DELETE, committed without waiting for the disk (see
  `PgFastPath.release_lease`: saves one flush per run, safely).
- renew, the live leases, the latest checkpoint and a run's head are single statements.

The rules' status sets (ended, final) are passed in as arrays, so `records` stays their
one definition. Duplicate keys become `CheckpointConflict`, every other driver error one
`CheckpointError` (`Connector.driver`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from agentflow._errors import CheckpointConflict, RunHeld
from agentflow.exec.checkpoints.records import ENDED, FINAL, LeaseMove, SealedCall, SealedCheckpoint
from agentflow.exec.checkpoints.rules import (
    check_call,
    check_lease_args,
    check_move_args,
    check_no_stored_rows,
    check_save,
)
from agentflow.exec.checkpoints.sqlalchemy.engines import Connector, LoopEngine

#: The rules' status sets, in the order the functions take them.
_ENDED: Final = sorted(ENDED)
_FINAL: Final = sorted(FINAL)
#: The lease columns every lease statement returns.
_LEASE: Final = "run_id, owner, token, expires_at"
#: The database's clock in seconds since the epoch, read inside each statement.
_NOW: Final = "extract(epoch from clock_timestamp())::double precision"


def functions(p: str) -> list[str]:
    """The DDL of the functions of tables prefixed `p` (migration 4 on PostgreSQL; idempotent).

    Each takes a last, unused parameter of the ``<p>meta`` table's row type (``p_schema``,
    NULL by default): that makes it depend on the table, so ``DROP TABLE <p>meta CASCADE``
    (how tenants' tables are dropped by prefix) drops the functions with it.
    """
    return [
        f"""
CREATE OR REPLACE FUNCTION {p}write(
    p_run text, p_step integer, p_flow text, p_status text, p_segment integer, p_saved_at double precision,
    p_payload bytea, p_kid text, p_sig text,
    c_segment integer[], c_seq integer[], c_kind text[], c_payload bytea[], c_kid text[], c_sig text[],
    p_ended text[], p_final text[], p_schema {p}meta DEFAULT NULL,
    OUT listed boolean, OUT last_step integer, OUT last_flow text, OUT last_status text, OUT last_segment integer,
    OUT counts integer[], OUT stored boolean, OUT written boolean
) LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    n integer := coalesce(cardinality(c_seq), 0);
    seen integer;
BEGIN
    written := false;
    stored := false;
    counts := '{{}}';
    IF p_step = 0 AND n = 0 THEN  -- a new run: no row to lock; the primary key picks one writer
        SELECT r.step, r.flow, r.status, r.segment INTO last_step, last_flow, last_status, last_segment
            FROM {p}runs r WHERE r.run_id = p_run;
    ELSE
        SELECT r.step, r.flow, r.status, r.segment INTO last_step, last_flow, last_status, last_segment
            FROM {p}runs r WHERE r.run_id = p_run FOR UPDATE;
    END IF;
    listed := FOUND;
    IF NOT listed THEN
        IF p_step IS DISTINCT FROM 0 OR n > 0 THEN
            RETURN;
        END IF;
        stored := EXISTS (SELECT 1 FROM {p}checkpoints c WHERE c.run_id = p_run)
            OR EXISTS (SELECT 1 FROM {p}calls c WHERE c.run_id = p_run);
        IF stored THEN
            RETURN;
        END IF;
        INSERT INTO {p}runs (run_id, flow, status, step, segment, saved_at)
            VALUES (p_run, p_flow, p_status, p_step, p_segment, p_saved_at);
        INSERT INTO {p}checkpoints (run_id, step, flow, status, segment, saved_at, payload, kid, sig)
            VALUES (p_run, p_step, p_flow, p_status, p_segment, p_saved_at, p_payload, p_kid, p_sig);
        written := true;
        RETURN;
    END IF;
    FOR i IN 1..n LOOP  -- each record's count: counted after the lock (a fresh snapshot), or one past the last
        seen := NULL;
        FOR j IN REVERSE i - 1..1 LOOP
            IF c_segment[j] = c_segment[i] THEN
                seen := counts[j] + 1;
                EXIT;
            END IF;
        END LOOP;
        IF seen IS NULL THEN
            SELECT count(*) INTO seen FROM {p}calls c WHERE c.run_id = p_run AND c.segment = c_segment[i];
        END IF;
        counts := counts || seen;
        IF c_seq[i] <> seen OR (c_kind[i] = 'started' AND (last_status = ANY (p_ended) OR c_segment[i] <> last_segment))
        THEN
            RETURN;
        END IF;
    END LOOP;
    IF p_step IS NOT NULL AND (last_flow <> p_flow OR last_status = ANY (p_final) OR p_step <> last_step + 1) THEN
        RETURN;
    END IF;
    INSERT INTO {p}calls (run_id, segment, seq, kind, payload, kid, sig)
        SELECT p_run, u.s, u.q, u.k, u.p, u.d, u.g FROM unnest(c_segment, c_seq, c_kind, c_payload, c_kid, c_sig)
            AS u(s, q, k, p, d, g);
    IF p_step IS NOT NULL THEN
        UPDATE {p}runs SET flow = p_flow, status = p_status, step = p_step, segment = p_segment, saved_at = p_saved_at
            WHERE run_id = p_run;
        INSERT INTO {p}checkpoints (run_id, step, flow, status, segment, saved_at, payload, kid, sig)
            VALUES (p_run, p_step, p_flow, p_status, p_segment, p_saved_at, p_payload, p_kid, p_sig);
    END IF;
    written := true;
END
$fn$""",
        f"""
CREATE OR REPLACE FUNCTION {p}write_moving(
    p_run text, p_step integer, p_flow text, p_status text, p_segment integer, p_saved_at double precision,
    p_payload bytea, p_kid text, p_sig text,
    c_segment integer[], c_seq integer[], c_kind text[], c_payload bytea[], c_kid text[], c_sig text[],
    p_ended text[], p_final text[], m_bearer text, m_to text, m_owner text, m_ttl double precision,
    p_schema {p}meta DEFAULT NULL,
    OUT listed boolean, OUT last_step integer, OUT last_flow text, OUT last_status text, OUT last_segment integer,
    OUT counts integer[], OUT stored boolean, OUT written boolean,
    OUT held_owner text, OUT held_expires double precision
) LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    held record;
BEGIN
    written := false;
    SELECT l.owner, l.token, l.expires_at INTO held FROM {p}leases l WHERE l.run_id = p_run FOR UPDATE;
    IF FOUND AND held.expires_at > {_NOW} AND held.token <> m_bearer THEN  -- another token's live lease
        held_owner := held.owner;
        held_expires := held.expires_at;
        RETURN;
    END IF;
    SELECT w.listed, w.last_step, w.last_flow, w.last_status, w.last_segment, w.counts, w.stored, w.written
        INTO listed, last_step, last_flow, last_status, last_segment, counts, stored, written
        FROM {p}write(p_run, p_step, p_flow, p_status, p_segment, p_saved_at, p_payload, p_kid, p_sig,
                      c_segment, c_seq, c_kind, c_payload, c_kid, c_sig, p_ended, p_final) w;
    IF NOT written THEN
        RETURN;
    END IF;
    IF m_to IS NULL THEN
        DELETE FROM {p}leases l WHERE l.run_id = p_run AND (l.token = m_bearer OR l.expires_at <= {_NOW});
    ELSE
        INSERT INTO {p}leases AS l (run_id, owner, token, expires_at) VALUES (p_run, m_owner, m_to, {_NOW} + m_ttl)
            ON CONFLICT (run_id) DO UPDATE
                SET owner = excluded.owner, token = excluded.token, expires_at = excluded.expires_at
                WHERE l.token = m_bearer OR l.expires_at <= {_NOW};
    END IF;
END
$fn$""",
        f"""
CREATE OR REPLACE FUNCTION {p}take_lease(
    p_run text, p_owner text, p_token text, p_ttl double precision, p_schema {p}meta DEFAULT NULL,
    OUT run_id text, OUT owner text, OUT token text, OUT expires_at double precision
) LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
BEGIN
    INSERT INTO {p}leases AS l (run_id, owner, token, expires_at) VALUES (p_run, p_owner, p_token, {_NOW} + p_ttl)
        ON CONFLICT (run_id) DO UPDATE
            SET owner = excluded.owner, token = excluded.token, expires_at = excluded.expires_at
            WHERE l.expires_at <= {_NOW} OR l.token = excluded.token;
    SELECT l.run_id, l.owner, l.token, l.expires_at INTO run_id, owner, token, expires_at
        FROM {p}leases l WHERE l.run_id = p_run;
END
$fn$""",
        f"""
CREATE OR REPLACE FUNCTION {p}release_lease(p_run text, p_token text, p_schema {p}meta DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    live boolean;
BEGIN
    SET LOCAL synchronous_commit TO off;  -- this statement's transaction only: see release_lease
    DELETE FROM {p}leases l WHERE l.run_id = p_run AND l.token = p_token RETURNING l.expires_at > {_NOW} INTO live;
    RETURN coalesce(live, false);
END
$fn$""",
    ]


def drop_functions(p: str) -> list[str]:
    """Statements dropping the functions of tables prefixed `p` (``DROP TABLE <p>meta CASCADE`` does too)."""
    return [f"DROP FUNCTION IF EXISTS {p}{name}" for name in ("write_moving", "write", "take_lease", "release_lease")]


class PgFastPath:
    """The one-round-trip operations of one store on PostgreSQL (its tables prefixed `p`).

    `ready` returns this loop's engine once the store's tables (and functions) are set up.
    """

    def __init__(self, db: Connector, ready: Callable[[], Awaitable[LoopEngine]], p: str) -> None:
        self._db = db
        self._ready = ready
        self._write = f"SELECT * FROM {p}write({', '.join(f'${i}' for i in range(1, 18))})"
        self._write_moving = f"SELECT * FROM {p}write_moving({', '.join(f'${i}' for i in range(1, 22))})"
        self._take = f"SELECT * FROM {p}take_lease($1, $2, $3, $4)"
        self._renew = (
            f"UPDATE {p}leases SET expires_at = {_NOW} + $3 WHERE run_id = $1 AND token = $2 AND expires_at > {_NOW} "
            f"RETURNING {_LEASE}"
        )
        self._release = f"SELECT {p}release_lease($1, $2)"
        self._leases = f"SELECT {_LEASE} FROM {p}leases WHERE run_id = ANY($1::text[]) AND expires_at > {_NOW}"
        self._markers = (
            f'SELECT "key", value, token, expires_at FROM {p}markers '
            f'WHERE "key" = ANY($1::text[]) AND expires_at > {_NOW}'
        )
        self._latest = f"SELECT * FROM {p}checkpoints WHERE run_id = $1 ORDER BY step DESC LIMIT 1"
        # one snapshot: the counts can show no fewer records than the checkpoint saw
        self._head = (
            f"SELECT c.*, (SELECT array_agg(array[k.segment, k.n]) FROM (SELECT segment, count(*)::integer AS n "
            f"FROM {p}calls WHERE run_id = $1 GROUP BY segment) k) AS segment_counts "
            f"FROM {p}checkpoints c WHERE c.run_id = $1 ORDER BY c.step DESC LIMIT 1"
        )

    async def write(
        self,
        run_id: str,
        step: int | None,
        checkpoint: SealedCheckpoint | None,
        calls: Sequence[SealedCall],
        move: LeaseMove | None = None,
    ) -> None:
        """Append `calls`, then save `checkpoint` as `step` (None: records only): all or nothing.

        `move`: the run's lease moves in the same statement (``<prefix>write_moving``), its
        rule checked first under the lease row's lock.

        Raises:
            CheckpointConflict: a rule refused it (the message is `rules`'), or another writer won a key.
            RunHeld: `move`'s bearer does not hold the lease, and another token holds it live.
            CheckpointNotFound: records for a run without a checkpoint.
        """
        cp = checkpoint
        args = (
            run_id,
            step,
            *((cp.flow, cp.status, cp.segment, cp.saved_at, cp.payload, cp.kid, cp.sig) if cp else (None,) * 7),
            [c.segment for c in calls],
            [c.seq for c in calls],
            [c.kind for c in calls],
            [c.payload for c in calls],
            [c.kid for c in calls],
            [c.sig for c in calls],
            _ENDED,
            _FINAL,
        )
        first = calls[0] if calls else None
        taken = (
            f"run {run_id!r} step {step}"
            if first is None
            else f"call record {first.segment}.{first.seq} of run {run_id!r}"
        )
        if move is not None:
            check_move_args(move)
        async with self._db.driver(await self._ready(), taken) as conn:
            if move is None:
                seen = await conn.fetchrow(self._write, *args)
            else:
                seen = await conn.fetchrow(self._write_moving, *args, move.bearer, move.to, move.owner, move.ttl_s)
        if seen["written"]:
            return
        if move is not None and seen["held_owner"] is not None:
            raise RunHeld(run_id, seen["held_owner"], seen["held_expires"])
        _refuse(run_id, step, cp, calls, seen)

    async def take_lease(self, run_id: str, owner: str, token: str, ttl_s: float) -> Mapping[str, Any] | None:
        """Take the run's lease unless another live token holds it; the lease row as it stands."""
        check_lease_args(owner, token, ttl_s)
        async with self._db.driver(await self._ready()) as conn:
            row: Mapping[str, Any] | None = await conn.fetchrow(self._take, run_id, owner, token, ttl_s)
        return row if row is not None and row["run_id"] is not None else None

    async def renew_lease(self, run_id: str, token: str, ttl_s: float) -> Mapping[str, Any] | None:
        """Push the expiry of `token`'s live lease; the row, or None if it holds none."""
        async with self._db.driver(await self._ready()) as conn:
            row: Mapping[str, Any] | None = await conn.fetchrow(self._renew, run_id, token, ttl_s)
        return row

    async def release_lease(self, run_id: str, token: str) -> bool:
        """Delete `token`'s lease of the run, live or lapsed; whether it was live.

        The only write whose commit does not wait for the disk (``synchronous_commit`` off
        for its own transaction): a release lost to a server crash leaves the lease to lapse,
        as a worker that dies holding it does, and any later commit that waits (a take of
        the same lease among them) makes it durable first, the log being written in order.
        """
        async with self._db.driver(await self._ready()) as conn:
            live = await conn.fetchval(self._release, run_id, token)
        return bool(live)

    async def leases(self, run_ids: Sequence[str]) -> Sequence[Mapping[str, Any]]:
        """The live lease rows among `run_ids`."""
        async with self._db.driver(await self._ready()) as conn:
            rows: Sequence[Mapping[str, Any]] = await conn.fetch(self._leases, list(run_ids))
        return rows

    async def peek_markers(self, keys: Sequence[str]) -> Sequence[Sequence[Any]]:
        """The live marker rows (key, value, token, expires_at) among `keys`: one statement, one round trip."""
        async with self._db.driver(await self._ready()) as conn:
            rows: Sequence[Sequence[Any]] = await conn.fetch(self._markers, list(keys))
        return rows

    async def latest(self, run_id: str) -> Mapping[str, Any] | None:
        """The run's newest checkpoint row, or None."""
        async with self._db.driver(await self._ready()) as conn:
            row: Mapping[str, Any] | None = await conn.fetchrow(self._latest, run_id)
        return row

    async def head(self, run_id: str) -> tuple[Mapping[str, Any] | None, dict[int, int]]:
        """The run's newest checkpoint row (or None) and its records per segment, read in one snapshot."""
        async with self._db.driver(await self._ready()) as conn:
            row: Mapping[str, Any] | None = await conn.fetchrow(self._head, run_id)
        counts = {int(segment): int(n) for segment, n in (row["segment_counts"] or ())} if row else {}
        return row, counts


def _refuse(
    run_id: str, step: int | None, cp: SealedCheckpoint | None, calls: Sequence[SealedCall], seen: Mapping[str, Any]
) -> None:
    """Raise the error `rules` gives for what the function read, in the order the other stores check."""
    listed: bool = seen["listed"]
    step_seen, flow_seen, status_seen = seen["last_step"], seen["last_flow"], seen["last_status"]
    counts = [*(seen["counts"] or ()), *[0] * len(calls)]  # none read past the first record refused
    for record, count in zip(calls, counts, strict=False):
        check_call(run_id, record, (step_seen, status_seen, seen["last_segment"]) if listed else None, count)
    if step is not None and cp is not None:
        if step == 0 and not calls:
            check_no_stored_rows(run_id, not listed and bool(seen["stored"]))
        check_save(run_id, step, cp.flow, (step_seen, flow_seen, status_seen) if listed else None)
    raise CheckpointConflict(f"run {run_id!r}: the write was refused by the store's rules but passes them here")
