"""The durable tool loop: a model asks for tool calls, agentflow runs them, until it answers.

Stages and checkpoints (``flow`` column: ``loop:<name>``):
- step 0 (stage ``start``) holds the initial messages;
- after each model reply (stage ``model``): the reply, which pins its tool calls;
- after the tool results (stage ``tools``): one tool message per call.

Storage does not grow with the square of the conversation: a checkpoint stores only the
messages added since the previous one (``new``) plus the history's length and a digest
chain over every message. Recovery reads the run's checkpoints in order, concatenates
``new`` and checks the chain, so every message is written once.

Each model call is preceded by a fenced marker record in the call log, so ``max_steps``
counts model calls across the whole run, recoveries included (a call cut off by a crash
counts). Tool calls of one reply go through the same call log as flow calls: identity
``turn/tools/index/args digest``, replay of finished calls, in-doubt checks.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from agentflow._errors import CheckpointConflict, CheckpointNotFound, Stale
from agentflow._events import Events
from agentflow._identity import RunContext, identity_body
from agentflow._run_types import RunStatus
from agentflow.exec._durable import Decision, Journal
from agentflow.exec._durable_read import (
    CallState,
    analyze,
    calls_in_doubt,
    check_no_later_records,
    check_still_paused,
    read_log,
    untouched_since,
)
from agentflow.exec._durable_seal import sealer_for
from agentflow.exec._executor import Approver, Executor
from agentflow.exec._loop_engine import LoopCursor, LoopEngine, LoopResult
from agentflow.exec._registry import Registry
from agentflow.exec.checkpoints._protocol import CheckpointStore
from agentflow.models._messages import Message
from agentflow.models._protocol import Model

__all__ = [
    "LoopResult",
    "advance_tool_loop",
    "read_tool_loop",
    "recover_tool_loop",
    "run_tool_loop",
    "start_tool_loop",
]


async def _seeds(
    engine: LoopEngine, lp: LoopCursor, body: dict[str, Any], rerun_in_doubt: bool, *, resuming: bool = False
) -> tuple[dict[str, CallState], int | None]:
    """The call states of the cut-off stage, and `untouched_since` of the log."""
    assert engine.store is not None and engine.sealer is not None
    marker = body.get("log")
    records = await read_log(engine.store, engine.sealer, lp.run_id, (marker[0], marker[1]) if marker else None)
    if resuming:
        check_still_paused(lp.run_id, records, marker)
    check_no_later_records(lp.run_id, records, lp.turn, model_ahead=1)
    lp.model_calls = max(lp.model_calls, sum(1 for r in records if r.body.get("model")))
    states = analyze(records, lp.turn) if lp.stage == "model" else {}
    calls_in_doubt(lp.run_id, states, engine.executor.registry, rerun_in_doubt)
    return states, untouched_since(records, marker)


def _engine(
    model: Model,
    registry: Registry,
    checkpoints: CheckpointStore | None,
    checkpoint_key: bytes | Sequence[bytes] | None,
    approver: Approver | None,
    events: Events | None,
) -> LoopEngine:
    executor = Executor(registry, approver=approver, events=events)
    return LoopEngine(model, executor, checkpoints, sealer_for(checkpoints, checkpoint_key))


async def run_tool_loop(
    model: Model,
    registry: Registry,
    messages: Sequence[Message] | None = None,
    *,
    run_id: str | None = None,
    checkpoints: CheckpointStore | None = None,
    checkpoint_key: bytes | Sequence[bytes] | None = None,
    max_steps: int = 10,
    ctx: RunContext | None = None,
    approver: Approver | None = None,
    approve: bool | Mapping[str, bool] | None = None,
    note: str | None = None,
    name: str = "tool_loop",
    events: Events | None = None,
) -> LoopResult:
    """Run a tool loop: ask the model, run the tools it asks for, repeat until it answers.

    With a store, the history is checkpointed after each model reply and after the tool
    results. Called with the `run_id` of a loop paused for an approval, it resumes that
    loop: `approve` decides the pending calls (None leaves it paused).

    Args:
        model: the model (see `agentflow.models`).
        registry: the tools the model may call.
        messages: the conversation to start from (not needed to resume).
        run_id: the run's id; unguessable by default.
        checkpoints: a checkpoint store (None: not durable).
        checkpoint_key: the signing key (required with any store but the memory one).
        max_steps: the most model calls the whole run may make, recoveries included.
        ctx: who the run acts for.
        approver: a synchronous approval port (else calls needing approval pause the run).
        approve: the decision when resuming a paused loop: one for all, or per call id.
        note: a note stored with the decision.
        name: the loop's name (runs are listed under ``loop:<name>``).
        events: an event hub to report to.

    Raises:
        CheckpointConflict: the run id belongs to a loop that is running or ended.
        ModelError: the model's reply could not be used (the run stays recoverable).
    """
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    engine = _engine(model, registry, checkpoints, checkpoint_key, approver, events)
    flow = f"loop:{name}"
    if run_id is not None and checkpoints is not None and await _exists(checkpoints, run_id):
        return await _resume(engine, run_id, flow, approve, note, ctx)
    if not messages:
        raise ValueError("run_tool_loop needs the messages to start from")
    rid = run_id or "loop-" + secrets.token_urlsafe(16)
    lp = LoopCursor(rid, flow, list(messages), max_steps, identity_body(engine.sealer, rid, ctx), ctx)
    await engine.save(lp, RunStatus.RUNNING, segment=0)
    return await engine.drive(lp)


async def _exists(store: CheckpointStore, run_id: str) -> bool:
    try:
        await store.latest(run_id)
    except CheckpointNotFound:
        return False
    return True


async def _resume(
    engine: LoopEngine,
    run_id: str,
    flow: str,
    approve: bool | Mapping[str, bool] | None,
    note: str | None,
    ctx: RunContext | None,
) -> LoopResult:
    lp, body = await _decide(engine, run_id, flow, approve, note, ctx)
    if approve is None:
        return engine._result(lp, RunStatus.PAUSED)
    seeds, _ = await _seeds(engine, lp, body, rerun_in_doubt=False, resuming=True)
    assert lp.step is not None
    await engine.save(lp, RunStatus.RUNNING, segment=lp.step + 1, claim="resume")
    return await engine.drive(lp, seeds, recovering=False)


async def _decide(
    engine: LoopEngine,
    run_id: str,
    flow: str,
    approve: bool | Mapping[str, bool] | None,
    note: str | None,
    ctx: RunContext | None,
) -> tuple[LoopCursor, dict[str, Any]]:
    """Load a paused loop and put the decision on it (`approve` None: leave it undecided)."""
    lp, status, body = await engine.load(run_id, flow, ctx)
    if status != RunStatus.PAUSED:
        hint = "use recover_tool_loop" if status == RunStatus.RUNNING else "it ended"
        raise CheckpointConflict(f"run {run_id!r} exists and is {status}, not paused ({hint})")
    if approve is None:
        return lp, body
    if isinstance(approve, bool):
        lp.decisions = {p.call_id: Decision(approve, note) for p in lp.pending}
    else:
        lp.decisions = {p.call_id: Decision(bool(approve[p.call_id]), note) for p in lp.pending if p.call_id in approve}
        if len(lp.decisions) != len(lp.pending):
            raise ValueError(f"run {run_id!r}: decide every pending call ({[p.call_id for p in lp.pending]})")
    lp.pending = []
    return lp, body


async def decide_tool_loop(
    registry: Registry,
    run_id: str,
    *,
    approve: bool | Mapping[str, bool],
    note: str | None = None,
    checkpoints: CheckpointStore,
    checkpoint_key: bytes | Sequence[bytes] | None = None,
    ctx: RunContext | None = None,
    name: str = "tool_loop",
) -> LoopResult:
    """Store the decision on a paused loop without running it; a worker then goes on from it.

    The decision is saved as the loop's next checkpoint (compare-and-set: of two racing
    decisions one wins). The returned result's `step` is the step to advance from.

    Raises:
        CheckpointConflict: the loop is not paused, or another decision won.
        ValueError: `approve` is a mapping that leaves a pending call undecided.
    """
    engine = LoopEngine(_NoModel(), Executor(registry), checkpoints, sealer_for(checkpoints, checkpoint_key))
    lp, _ = await _decide(engine, run_id, f"loop:{name}", approve, note, ctx)
    assert lp.step is not None
    await engine.save(lp, RunStatus.RUNNING, segment=lp.step + 1, claim="resume")
    return engine._result(lp, RunStatus.RUNNING)


async def recover_tool_loop(
    model: Model,
    registry: Registry,
    run_id: str,
    *,
    checkpoints: CheckpointStore,
    checkpoint_key: bytes | Sequence[bytes] | None = None,
    rerun_in_doubt: bool = False,
    ctx: RunContext | None = None,
    approver: Approver | None = None,
    name: str = "tool_loop",
    events: Events | None = None,
) -> LoopResult:
    """Continue a tool loop whose worker died, from its latest checkpoint.

    Raises:
        CheckpointNotFound: nothing is stored for the run.
        CheckpointConflict: the run ended, or another worker claimed it first.
        CheckpointStoreCorrupt: a checkpoint, the history chain or a call record fails its check.
        RecoveryNeedsDecision: a tool call is in doubt and its tool is not idempotent.
        IdentityMismatch: `ctx` is for someone else, or the run's principal is missing.
    """
    engine = _engine(model, registry, checkpoints, checkpoint_key, approver, events)
    lp, status, body = await engine.load(run_id, f"loop:{name}", ctx)
    if status == RunStatus.PAUSED:
        return engine._result(lp, RunStatus.PAUSED)
    if status != RunStatus.RUNNING:
        raise CheckpointConflict(f"run {run_id!r} already ended ({status}); there is nothing to recover")
    seeds, _ = await _seeds(engine, lp, body, rerun_in_doubt)
    assert lp.step is not None
    await engine.save(lp, RunStatus.RUNNING, segment=lp.step + 1, claim="recovery")
    return await engine.drive(lp, seeds)


async def start_tool_loop(
    registry: Registry,
    messages: Sequence[Message],
    *,
    run_id: str | None = None,
    checkpoints: CheckpointStore,
    checkpoint_key: bytes | Sequence[bytes] | None = None,
    max_steps: int = 10,
    ctx: RunContext | None = None,
    name: str = "tool_loop",
) -> LoopResult:
    """Save a new loop's step 0 (its messages) without running it; a worker advances it.

    Raises:
        CheckpointConflict: the run id is taken.
    """
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    if not messages:
        raise ValueError("start_tool_loop needs the messages to start from")
    engine = LoopEngine(_NoModel(), Executor(registry), checkpoints, sealer_for(checkpoints, checkpoint_key))
    rid = run_id or "loop-" + secrets.token_urlsafe(16)
    lp = LoopCursor(rid, f"loop:{name}", list(messages), max_steps, identity_body(engine.sealer, rid, ctx), ctx)
    await engine.save(lp, RunStatus.RUNNING, segment=0)
    return engine._result(lp, RunStatus.RUNNING)


async def advance_tool_loop(
    model: Model,
    registry: Registry,
    run_id: str,
    *,
    checkpoints: CheckpointStore,
    checkpoint_key: bytes | Sequence[bytes] | None = None,
    expected_step: int | None = None,
    handoff: bool = False,
    rerun_in_doubt: bool = False,
    name: str = "tool_loop",
    events: Events | None = None,
) -> LoopResult:
    """Claim a loop and run exactly one stage of it: one model call, or one round of tools.

    Raises:
        Stale: the latest step is not `expected_step` (a late or duplicate message).
        CheckpointConflict: the loop ended or is paused, or another worker claimed it first.
        RecoveryNeedsDecision: a tool call is in doubt and its tool is not idempotent.
    """
    engine = _engine(model, registry, checkpoints, checkpoint_key, None, events)
    lp, status, body = await engine.load(run_id, f"loop:{name}", None)
    if expected_step is not None and lp.step != expected_step:
        raise Stale(f"loop {run_id!r} is at step {lp.step}, not {expected_step}: this message is late or a duplicate")
    if status != RunStatus.RUNNING:
        raise CheckpointConflict(f"loop {run_id!r} is {status}; only a running loop can be advanced")
    seeds, next_seq = await _seeds(engine, lp, body, rerun_in_doubt)
    assert lp.step is not None and engine.store is not None and engine.sealer is not None
    # As for flows (`agentflow.flow._recover`): a clean handoff continues the segment unclaimed.
    # Nothing was logged since the checkpoint, so any seeds predate it: the finished calls of
    # a round paused for approval, replayed after a stored decision (`decide_tool_loop`).
    if handoff and next_seq is not None:
        lp.journal = Journal(engine.store, engine.sealer, run_id, int(body["log"][0]), next_seq)
        return await engine.drive(lp, seeds, limit=1, recovering=False)
    await engine.save(lp, RunStatus.RUNNING, segment=lp.step + 1, claim="recovery")
    return await engine.drive(lp, seeds, limit=1, recovering=True)


class _NoModel:
    """Stands in where no model is called (saving step 0)."""

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        raise RuntimeError("no model is called while a loop is only being started")


async def read_tool_loop(
    run_id: str,
    *,
    checkpoints: CheckpointStore,
    checkpoint_key: bytes | Sequence[bytes] | None = None,
    name: str = "tool_loop",
) -> LoopResult:
    """Read a loop as its checkpoints show it (history checked), without touching it.

    Raises:
        CheckpointNotFound: unknown run.
        CheckpointStoreCorrupt: a checkpoint or the history chain fails its check.
    """
    engine = LoopEngine(_NoModel(), Executor(Registry()), checkpoints, sealer_for(checkpoints, checkpoint_key))
    lp, status, _ = await engine.load(run_id, f"loop:{name}", None)
    return engine._result(lp, RunStatus(status))
