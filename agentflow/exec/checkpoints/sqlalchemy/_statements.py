"""The tables of `SQLAlchemyCheckpointStore` and every statement it runs, built once per store.

Each statement takes its values as bound parameters, mostly named after their columns, so
a call passes a dict and SQLAlchemy finds the compiled form through the statement's
memoized cache key: nothing is built, hashed or compiled per call.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Final

import sqlalchemy as sa

from agentflow.exec.checkpoints.records import UNFINISHED, SealedCall, SealedCheckpoint, stored_fields

#: The parameters of a save besides ``run`` (the run's id): the checkpoint's other fields.
SAVE_FIELDS: Final = tuple(f.name for f in fields(SealedCheckpoint) if f.name != "run_id")
#: The columns of ``runs`` a save (and a relist) sets besides ``run_id``: the latest checkpoint's fields in clear.
LATEST_FIELDS: Final = ("flow", "status", "step", "segment", "saved_at")
#: The parameters of a call record's insert.
CALL_FIELDS: Final = tuple(f.name for f in stored_fields(SealedCall))


@dataclass(frozen=True, slots=True)
class Tables:
    """The tables of one tenant."""

    metadata: sa.MetaData
    meta: sa.Table
    checkpoints: sa.Table
    runs: sa.Table
    calls: sa.Table
    leases: sa.Table
    events: sa.Table
    markers: sa.Table
    prefix: str
    """What every table name starts with (and the PostgreSQL functions' names, `sqlalchemy._pg`)."""


def tables(p: str) -> Tables:
    """Describe the tables whose names start with `p`."""
    md = sa.MetaData()

    def col(name: str, kind: type[sa.types.TypeEngine[Any]] | sa.types.TypeEngine[Any], **kw: Any) -> sa.Column[Any]:
        return sa.Column(name, kind, nullable=False, **kw)

    def sealed() -> list[sa.Column[Any]]:
        return [col("payload", sa.LargeBinary), col("kid", sa.Text), col("sig", sa.Text)]

    return Tables(
        md,
        sa.Table(f"{p}meta", md, col("key", sa.Text, primary_key=True), col("value", sa.Text)),
        sa.Table(
            f"{p}checkpoints", md, col("run_id", sa.Text), col("step", sa.Integer), col("flow", sa.Text),
            col("status", sa.Text), col("segment", sa.Integer), col("saved_at", sa.Double), *sealed(),
            sa.PrimaryKeyConstraint("run_id", "step", name=f"{p}checkpoints_pk"),
        ),
        sa.Table(
            f"{p}runs", md, col("run_id", sa.Text, primary_key=True), col("flow", sa.Text), col("status", sa.Text),
            col("step", sa.Integer), col("segment", sa.Integer), col("saved_at", sa.Double),
            sa.Index(f"{p}runs_flow_status", "flow", "status"), sa.Index(f"{p}runs_saved_at", "saved_at"),
        ),
        sa.Table(
            f"{p}calls", md, col("run_id", sa.Text), col("segment", sa.Integer), col("seq", sa.Integer),
            col("kind", sa.Text), *sealed(),
            sa.PrimaryKeyConstraint("run_id", "segment", "seq", name=f"{p}calls_pk"),
        ),
        sa.Table(
            f"{p}leases", md, col("run_id", sa.Text, primary_key=True), col("owner", sa.Text),
            col("token", sa.Text), col("expires_at", sa.Double),
        ),
        sa.Table(
            f"{p}events", md,
            col("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
            col("run_id", sa.Text), *sealed(),
            sa.Index(f"{p}events_by_run", "run_id", "id"), sqlite_autoincrement=True,
        ),
        sa.Table(
            f"{p}markers", md, col("key", sa.Text, primary_key=True), col("value", sa.Text),
            col("token", sa.Text), col("expires_at", sa.Double),
        ),
        p,
    )  # fmt: skip


def _bound(*names: str) -> dict[str, sa.BindParameter[Any]]:
    return {name: sa.bindparam(name) for name in names}


@dataclass(frozen=True, slots=True)
class Statements:
    """Every statement a store runs after setup, with the parameters it takes.

    The save statements name the run's id ``run``: SQLAlchemy takes a parameter named after
    a column that an INSERT or UPDATE does not set (``run_id`` of the UPDATE) as a value for it.
    """

    insert_run: sa.Insert  # run, SAVE_FIELDS: a new run's ``runs`` row
    update_run: sa.Update  # run, SAVE_FIELDS: point ``runs`` at the new latest
    lock_entry: sa.Select[Any]  # run_id: the run's whole ``runs`` row, FOR UPDATE (relist)
    newest_shared: sa.Select[Any]  # run_id: the newest checkpoint row, FOR SHARE on PostgreSQL (relist)
    history: sa.Select[Any]  # run_id
    unfinished: sa.Select[Any]  # flow
    list_runs: sa.Select[Any]  # limit
    list_runs_of_flow: sa.Select[Any]  # flow, limit
    delete: tuple[sa.Delete, ...]  # run_id: runs first (a save's lock order), the lease too, runs again last
    calls: sa.Select[Any]  # run_id
    stored_runs: sa.Select[Any]  # no parameters: every run id with a checkpoint row


def statements(t: Tables) -> Statements:
    """Build every statement on the tables `t`."""
    runs, cps, calls, leases = t.runs, t.checkpoints, t.calls, t.leases
    run_id: sa.BindParameter[str] = sa.bindparam("run_id")
    limit = sa.bindparam("limit", type_=sa.Integer)
    run: sa.BindParameter[str] = sa.bindparam("run")
    latest = {"run_id": run} | _bound(*LATEST_FIELDS)
    insert_run = sa.insert(runs).values(latest)
    update_run = sa.update(runs).where(runs.c.run_id == run).values(_bound(*LATEST_FIELDS))
    current = runs.join(cps, (cps.c.run_id == runs.c.run_id) & (cps.c.step == runs.c.step))
    list_runs = sa.select(cps).select_from(current).order_by(runs.c.saved_at.desc(), runs.c.run_id)
    newest = sa.select(cps).where(cps.c.run_id == run_id).order_by(cps.c.step.desc()).limit(1)
    return Statements(
        insert_run=insert_run,
        update_run=update_run,
        lock_entry=sa.select(runs).where(runs.c.run_id == run_id).with_for_update(),
        # A relist that inserts a runs row holds this lock until it commits, so a delete (whose
        # checkpoint DELETE waits for it) removes that row with its final runs DELETE.
        newest_shared=newest.with_for_update(read=True),
        history=sa.select(cps).where(cps.c.run_id == run_id).order_by(cps.c.step),
        # unordered: a sort of 100,000 ids would spill past work_mem
        unfinished=sa.select(runs.c.run_id).where(
            runs.c.flow == sa.bindparam("flow"), runs.c.status.in_(sorted(UNFINISHED))
        ),
        list_runs=list_runs.limit(limit),
        list_runs_of_flow=list_runs.where(runs.c.flow == sa.bindparam("flow")).limit(limit),
        # runs first, in a save's lock order; runs again last, for a row a relist inserted meanwhile
        delete=tuple(
            sa.delete(table).where(table.c.run_id == run_id) for table in (runs, cps, calls, leases, t.events, runs)
        ),
        calls=sa.select(calls).where(calls.c.run_id == run_id).order_by(calls.c.segment, calls.c.seq),
        stored_runs=sa.select(cps.c.run_id).distinct(),
    )
