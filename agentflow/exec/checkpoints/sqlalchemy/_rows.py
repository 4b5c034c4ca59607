"""Rebuilding the sealed rows of `SQLAlchemyCheckpointStore` from database rows, each field's type checked.

A SQLite column takes a value of any type, and a row changed by hand can hold anything, so
no field is trusted: an int widens to float, a buffer becomes bytes, and any other
mismatch is `CheckpointStoreCorrupt` naming the run. Rows come as mappings (SQLAlchemy's
``row._mapping``, or an asyncpg record from the PostgreSQL fast path).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeVar

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import Lease, SealedCall, SealedCheckpoint, stored_fields

R = TypeVar("R", SealedCheckpoint, SealedCall)

#: Each sealed row's fields and their types (annotations are strings under postponed evaluation).
_KINDS: Final[dict[str, type]] = {"str": str, "int": int, "float": float, "bytes": bytes}
_LAYOUT: Final[dict[type, list[tuple[str, type]]]] = {
    cls: [(f.name, _KINDS[f.type if isinstance(f.type, str) else f.type.__name__]) for f in stored_fields(cls)]
    for cls in (SealedCheckpoint, SealedCall)
}


def sealed(cls: type[R], row: Mapping[str, Any], run_id: str, shown: str) -> R:
    """Rebuild a sealed row of run `run_id` from `row` (`shown` names the store in the error).

    Raises:
        CheckpointStoreCorrupt: a field is missing or of another type.
    """
    try:
        return cls(**{name: as_kind(kind, row[name], name) for name, kind in _LAYOUT[cls]})
    except (TypeError, KeyError) as exc:
        raise CheckpointStoreCorrupt(f"{shown}: a stored row of run {run_id!r} is unreadable: {exc}") from None


def lease(row: Any, shown: str) -> Lease:
    """Rebuild a lease from a row of (run_id, owner, token, expires_at).

    Raises:
        CheckpointStoreCorrupt: a field is of another type.
    """
    run_id, owner, token, expires_at = row
    if isinstance(expires_at, int) and not isinstance(expires_at, bool):
        expires_at = float(expires_at)
    if not (isinstance(owner, str) and isinstance(token, str) and isinstance(expires_at, float)):
        raise CheckpointStoreCorrupt(f"{shown}: the lease row of run {run_id!r} is unreadable")
    return Lease(run_id, owner, token, expires_at)


def as_kind(kind: type, value: object, name: str) -> Any:
    """Return `value` as `kind`, widening int to float and buffers to bytes; refuse anything else."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif kind is bytes and isinstance(value, bytearray | memoryview):
        value = bytes(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{name} is {type(value).__name__}, not {kind.__name__}")
    return value
