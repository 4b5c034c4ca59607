"""Control records: the signed decisions that steer a run, and the one rule for each.

A control record is a claim checkpoint's extra fields, sealed with the checkpoint like
everything else in it (so a hand-written or forged one fails the signature check before
anything reads it):
- ``operator``: who decided (a person's name, or the process that acted for nobody);
- ``rerun``: the ids of the calls in doubt that the operator checked at their systems
  and decided to run again;
- ``awaiting``: ``[[tool, why], ...]``: a worker found calls in doubt that nobody may
  rerun without a decision, and parked the run (recover_all then leaves it alone).

An operator's word on a call in doubt is one of three (`InDoubtDecision`): `Rerun` it
(granted through ``rerun``), it `Happened` with a given result, or it `DidNotHappen` and
must not run. The last two are not grants but facts: they are written into the call log
as a signed ``done`` or ``failed`` record marked ``supplied`` (with the operator), in
the decision claim's own segment and in the same atomic write as the claim, so every
later reader replays them like any finished call.

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
from agentflow.exec._registry import Registry
from agentflow.exec.calls.read import CallState, needs_decision

#: The fields a claim may carry besides its cause.
CONTROL_FIELDS = ("operator", "rerun", "awaiting", "reason", "migrated", "woke")


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


def without_failed(states: Mapping[str, CallState]) -> dict[str, CallState]:
    """The calls of a superstep a retry continues: the failed ones are left out, so they run again."""
    return {cid: s for cid, s in states.items() if s.kind != "failed"}


def parked(body: Mapping[str, Any]) -> bool:
    """Whether the checkpoint parks the run on calls in doubt (it waits for a decision)."""
    return "claim" in body and bool(body.get("awaiting"))


def awaiting_record(calls: Sequence[Sequence[str]]) -> dict[str, Any]:
    """The control record of a claim that parks a run on `calls` (``(tool, why)`` pairs)."""
    return {"awaiting": [[str(tool), str(why)] for tool, why in calls]}


@dataclass(frozen=True)
class Rerun:
    """An operator's word on a call in doubt: it did not have its effect; run it again."""


@dataclass(frozen=True)
class Happened:
    """An operator's word on a call in doubt: it had its effect, and returned `result`.

    The result is checked against the tool's return type and stored as the call's result;
    the call is never run again.
    """

    result: Any


@dataclass(frozen=True)
class DidNotHappen:
    """An operator's word on a call in doubt: it had no effect and must not run; the call fails with `reason`."""

    reason: str = ""


#: What an operator may say about one call in doubt.
InDoubtDecision = Rerun | Happened | DidNotHappen


def settle(
    run_id: str,
    doubtful: Sequence[CallState],
    choices: Mapping[str, InDoubtDecision] | None,
    registry: Registry,
    operator: str | None,
) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    """Turn an operator's word on each call in doubt into a rerun grant and supplied records.

    Args:
        run_id: the run (for messages).
        doubtful: its calls in doubt.
        choices: one decision per call id; None reruns every one.
        registry: the tools (to check a supplied result against the tool's return type).
        operator: who decided (written into each supplied record).

    Returns:
        The call ids granted a rerun, and the ``(kind, body)`` records to store.

    Raises:
        ValueError: `choices` names a call that is not in doubt, leaves a call undecided
            that may not rerun unasked (`calls.read.needs_decision`), or supplies a result
            that does not fit the tool's return type.
    """
    ids = [s.call_id for s in doubtful]
    if choices is None:
        return ids, []
    unknown = sorted(set(choices) - set(ids))
    if unknown:
        raise ValueError(f"run {run_id!r} has no call in doubt {unknown}; in doubt: {ids}")
    # A call left out reruns only where it would without any decision.
    missing = [s.call_id for s in doubtful if s.call_id not in choices and needs_decision(s, registry) is not None]
    if missing:
        raise ValueError(f"run {run_id!r}: decide every call in doubt; missing {missing}")
    rerun: list[str] = []
    records: list[tuple[str, dict[str, Any]]] = []
    supplied = {"operator": operator}
    for state in doubtful:
        choice = choices.get(state.call_id, Rerun())
        base = {"call_id": state.call_id, "superstep": state.superstep, "supplied": supplied}
        if isinstance(choice, Rerun):
            rerun.append(state.call_id)
        elif isinstance(choice, Happened):
            records.append(("done", {**base, "result": _checked_result(registry, state, choice.result)}))
        elif isinstance(choice, DidNotHappen):
            why = f"{state.tool} did not happen, said {operator or 'an operator'}" + (
                f": {choice.reason}" if choice.reason else ""
            )
            records.append(("failed", {**base, "error": why}))
        else:
            raise TypeError(f"decide each call with Rerun(), Happened(result) or DidNotHappen(reason), not {choice!r}")
    return rerun, records


def _checked_result(registry: Registry, state: CallState, value: Any) -> Any:
    """The JSON form of a supplied result, once it fits the tool's return type."""
    if state.tool not in registry:
        raise ValueError(
            f"call {state.call_id}: tool {state.tool!r} is not registered here, so its result cannot be checked: "
            "decide it where the tool is deployed, or say it did not happen (DidNotHappen: it never runs again)"
        )
    tool = registry.get(state.tool)
    try:
        return tool.encode_result(tool.revive_result(value))
    except Exception as exc:
        raise ValueError(
            f"call {state.call_id}: the result given does not fit {state.tool!r}'s return type: {exc}"
        ) from None
