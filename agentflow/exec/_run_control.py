"""Control records: the signed decisions that steer a run, and the one rule for each.

A control record is a claim checkpoint's extra fields, sealed with the checkpoint like
everything else in it (so a hand-written or forged one fails the signature check before
anything reads it):
- ``operator``: who decided (a person's name, or the process that acted for nobody);
- ``rerun``: the ids of the calls in doubt that the operator checked at their systems
  and decided to run again;
- ``awaiting``: ``[[tool, why], ...]``: a worker found calls in doubt that nobody may
  rerun without a decision, and parked the run (recover_all then leaves it alone).

Invariants:
- Only the latest checkpoint's record steers: a later checkpoint spends it.
- A ``rerun`` grant covers a call only while the call has no record in the claim's own
  segment or later: once it was started again under that claim, the grant is spent, and a
  crash in that second attempt needs a new decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec._durable_read import CallState

#: The fields a claim may carry besides its cause.
CONTROL_FIELDS = ("operator", "rerun", "awaiting")


@dataclass(frozen=True)
class Control:
    """A checkpoint's control record, as people read it."""

    claim: str | None = None
    """Why the run was claimed (``recovery``, ``resume``, ``handoff``, ``decision``), or None."""
    operator: str | None = None
    """Who decided, or None."""
    rerun: tuple[str, ...] = ()
    """Calls in doubt an operator decided to run again."""
    awaiting: tuple[tuple[str, str], ...] = ()
    """Calls in doubt the run waits for a decision about: ``(tool, why)``."""
    by: str | None = None
    """Who saved the checkpoint (the lease holder)."""


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointStoreCorrupt(f"a checkpoint's {what} is malformed: {value!r}")
    return list(value)


def control_of(body: Mapping[str, Any]) -> Control:
    """Read the control record of a checked checkpoint body.

    Raises:
        CheckpointStoreCorrupt: a field is malformed (signed, so written by a faulty writer).
    """
    operator, by = body.get("operator"), body.get("by")
    if operator is not None and not isinstance(operator, str):
        raise CheckpointStoreCorrupt(f"a checkpoint's operator is malformed: {operator!r}")
    if by is not None and not isinstance(by, str):
        raise CheckpointStoreCorrupt(f"a checkpoint's saver is malformed: {by!r}")
    awaiting = body.get("awaiting", [])
    if not isinstance(awaiting, list):
        raise CheckpointStoreCorrupt(f"a checkpoint's awaited calls are malformed: {awaiting!r}")
    pairs = [_strings(pair, "awaited call") for pair in awaiting]
    if any(len(p) != 2 for p in pairs):
        raise CheckpointStoreCorrupt(f"a checkpoint's awaited calls are malformed: {awaiting!r}")
    claim = body.get("claim")
    return Control(
        claim if isinstance(claim, str) else None,
        operator,
        tuple(_strings(body.get("rerun", []), "rerun decision")),
        tuple((p[0], p[1]) for p in pairs),
        by,
    )


def granted(body: Mapping[str, Any], segment: int, states: Mapping[str, CallState]) -> set[str]:
    """The calls in doubt that the latest checkpoint's signed ``rerun`` decision lets run again.

    Args:
        body: the latest checkpoint's body (checked).
        segment: its segment (a claim's segment is its own step).
        states: the calls of the step being continued.
    """
    if "claim" not in body:
        return set()
    ids = control_of(body).rerun
    return {cid for cid in ids if cid in states and all(seg < segment for seg in states[cid].segments)}


def parked(body: Mapping[str, Any]) -> bool:
    """Whether the checkpoint parks the run on calls in doubt (it waits for a decision)."""
    return "claim" in body and bool(body.get("awaiting"))


def awaiting_record(calls: Sequence[Sequence[str]]) -> dict[str, Any]:
    """The control record of a claim that parks a run on `calls` (``(tool, why)`` pairs)."""
    return {"awaiting": [[str(tool), str(why)] for tool, why in calls]}
