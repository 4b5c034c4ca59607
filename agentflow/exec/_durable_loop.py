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

from agentflow._errors import CheckpointConflict, CheckpointNotFound
from agentflow._events import Events
from agentflow._identity import RunContext, identity_body
from agentflow._run_types import RunStatus
from agentflow.exec._executor import Approver, Executor
from agentflow.exec._loop_engine import LoopCursor, LoopDriver, LoopProtocol, LoopResult
from agentflow.exec._registry import Registry
from agentflow.exec._run_control import InDoubtDecision
from agentflow.exec._run_keys import sealer_for
from agentflow.exec._run_lease import DEFAULT_LEASE_S, Ownership
from agentflow.exec._run_protocol import RunProtocol
from agentflow.exec._tracing import Tracer
from agentflow.exec.checkpoints._protocol import CheckpointStore
from agentflow.models._messages import Message
from agentflow.models._protocol import Model

__all__ = [
    "LoopResult",
    "advance_tool_loop",
    "cancel_tool_loop",
    "decide_in_doubt_tool_loop",
    "read_tool_loop",
    "recover_tool_loop",
    "run_tool_loop",
    "start_tool_loop",
]


def _protocol(
    model: Model,
    registry: Registry,
    checkpoints: CheckpointStore | None,
    checkpoint_key: bytes | Sequence[bytes] | None,
    name: str,
    approver: Approver | None = None,
    events: Events | None = None,
    lease_s: float = DEFAULT_LEASE_S,
    owner: str | None = None,
    tracer: Tracer | None = None,
) -> LoopProtocol:
    """The run protocol for the loop `name` over `checkpoints`, holding runs as `owner` for `lease_s`."""
    executor = Executor(registry, approver=approver, events=events, tracer=tracer)
    driver = LoopDriver(model, executor, name)
    ownership = Ownership(owner, lease_s) if owner is not None else Ownership.of(lease_s)
    sealer = sealer_for(checkpoints, checkpoint_key)
    return RunProtocol(
        driver, checkpoints, sealer, registry, executor.events, ownership=ownership, tracer=executor.tracer
    )


def _cursor(
    proto: LoopProtocol, run_id: str | None, messages: Sequence[Message], max_steps: int, ctx: RunContext | None
) -> LoopCursor:
    """A new loop's cursor, before its step 0 is saved."""
    rid = run_id or "loop-" + secrets.token_urlsafe(16)
    return LoopCursor(rid, identity_body(proto.sealer, rid, ctx), ctx, list(messages), max_steps)


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
    lease_s: float = DEFAULT_LEASE_S,
    owner: str | None = None,
    tracer: Tracer | None = None,
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
        lease_s: how long this process's hold on the run lasts unless renewed (renewed every
            third of it while the loop works); nothing else acts on the run meanwhile.
        owner: names this process in leases and checkpoints (default ``runner@<host>:<pid>``).
        tracer: where the loop reports its spans (`agentflow.observe.Tracing`; off by default).

    Raises:
        CheckpointConflict: the run id belongs to a loop that is running or ended.
        ModelError: the model's reply could not be used (the run stays recoverable).
    """
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    proto = _protocol(model, registry, checkpoints, checkpoint_key, name, approver, events, lease_s, owner, tracer)
    if run_id is not None and checkpoints is not None and await _exists(checkpoints, run_id):
        if approve is None:
            return await _paused(proto, run_id, ctx)
        return await proto.resume(run_id, approve=approve, note=note, ctx=ctx, limit=None)
    if not messages:
        raise ValueError("run_tool_loop needs the messages to start from")
    lp = _cursor(proto, run_id, messages, max_steps, ctx)
    return await proto.begin(lp, None)


async def _exists(store: CheckpointStore, run_id: str) -> bool:
    try:
        await store.latest(run_id)
    except CheckpointNotFound:
        return False
    return True


async def _paused(proto: LoopProtocol, run_id: str, ctx: RunContext | None) -> LoopResult:
    """A paused loop as it stands (`run_tool_loop` called again with no decision)."""
    opened = await proto.open(run_id, ctx)
    if opened.status != RunStatus.PAUSED:
        hint = "use recover_tool_loop" if opened.status == RunStatus.RUNNING else "it ended"
        raise CheckpointConflict(f"run {run_id!r} exists and is {opened.status}, not paused ({hint})")
    return proto.driver.result(opened.cur, RunStatus.PAUSED)


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
    lease_s: float = DEFAULT_LEASE_S,
    owner: str | None = None,
    operator: str | None = None,
) -> LoopResult:
    """Store the decision on a paused loop without running it; a worker then goes on from it.

    The decision is saved as the loop's next checkpoint (compare-and-set: of two racing
    decisions one wins). The returned result's `step` is the step to advance from.

    Raises:
        CheckpointConflict: the loop is not paused, or another decision won.
        ValueError: `approve` is a mapping that leaves a pending call undecided.
    """
    proto = _protocol(_NoModel(), registry, checkpoints, checkpoint_key, name, lease_s=lease_s, owner=owner)
    return await proto.resume(run_id, approve=approve, note=note, ctx=ctx, limit=0, operator=operator)


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
    lease_s: float = DEFAULT_LEASE_S,
    owner: str | None = None,
    operator: str | None = None,
    tracer: Tracer | None = None,
) -> LoopResult:
    """Continue a tool loop whose worker died, from its latest checkpoint (`tracer`: see `run_tool_loop`).

    Raises:
        CheckpointNotFound: nothing is stored for the run.
        CheckpointConflict: the run ended, or another worker claimed it first.
        CheckpointStoreCorrupt: a checkpoint, the history chain or a call record fails its check.
        RecoveryNeedsDecision: a tool call is in doubt and its tool is not idempotent.
        IdentityMismatch: `ctx` is for someone else, or the run's principal is missing.
    """
    proto = _protocol(model, registry, checkpoints, checkpoint_key, name, approver, events, lease_s, owner, tracer)
    return await proto.recover(run_id, rerun_in_doubt=rerun_in_doubt, ctx=ctx, operator=operator)


async def wake_tool_loop(
    model: Model,
    registry: Registry,
    run_id: str,
    *,
    checkpoints: CheckpointStore,
    checkpoint_key: bytes | Sequence[bytes] | None = None,
    ctx: RunContext | None = None,
    name: str = "tool_loop",
    events: Events | None = None,
    lease_s: float = DEFAULT_LEASE_S,
    owner: str | None = None,
    now: float | None = None,
    max_stages: int | None = None,
) -> LoopResult:
    """Wake a tool loop that waits until the time a waiting tool returned (``@registry.tool(waits=True)``).

    Raises:
        NotDue: its time has not come (nothing is done).
        CheckpointConflict: the loop is not waiting, or someone else woke it first.
    """
    proto = _protocol(model, registry, checkpoints, checkpoint_key, name, None, events, lease_s, owner, None)
    return await proto.wake(run_id, limit=max_stages, ctx=ctx, now=now)


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
    lease_s: float = DEFAULT_LEASE_S,
    owner: str | None = None,
    tracer: Tracer | None = None,
) -> LoopResult:
    """Save a new loop's step 0 (its messages) without running it; a worker advances it.

    With `tracer`, step 0 carries the trace the loop's stages continue (see `run_tool_loop`).

    Raises:
        CheckpointConflict: the run id is taken.
    """
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    if not messages:
        raise ValueError("start_tool_loop needs the messages to start from")
    proto = _protocol(
        _NoModel(), registry, checkpoints, checkpoint_key, name, lease_s=lease_s, owner=owner, tracer=tracer
    )
    lp = _cursor(proto, run_id, messages, max_steps, ctx)
    async with proto.hold(lp.run_id):
        await proto.start(lp)
    return proto.driver.result(lp, RunStatus.RUNNING)


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
    lease_s: float = DEFAULT_LEASE_S,
    owner: str | None = None,
    park: bool = False,
    spend: str | None = None,
    tracer: Tracer | None = None,
) -> LoopResult:
    """Claim a loop and run exactly one stage of it: one model call, or one round of tools.

    `tracer`: see `run_tool_loop`.

    Raises:
        Stale: the latest step is not `expected_step` (a late or duplicate message).
        CheckpointConflict: the loop ended or is paused, or another worker claimed it first.
        RecoveryNeedsDecision: a tool call is in doubt and its tool is not idempotent.
    """
    proto = _protocol(model, registry, checkpoints, checkpoint_key, name, None, events, lease_s, owner, tracer)
    return await proto.advance(
        run_id,
        expected_step=expected_step,
        rerun_in_doubt=rerun_in_doubt,
        handoff=handoff,
        park=park,
        spend=spend,
    )


async def decide_in_doubt_tool_loop(
    run_id: str,
    *,
    checkpoints: CheckpointStore,
    checkpoint_key: bytes | Sequence[bytes] | None = None,
    registry: Registry | None = None,
    calls: Mapping[str, InDoubtDecision] | None = None,
    operator: str | None = None,
    name: str = "tool_loop",
    lease_s: float = DEFAULT_LEASE_S,
    owner: str | None = None,
) -> int:
    """Store an operator's word on a loop's calls in doubt; return the decision's step.

    See `FlowRunner.decide_in_doubt`: per call id `Rerun()`, `Happened(result)` (checked
    against the tool's return type, so `registry` is needed) or `DidNotHappen(reason)`;
    without `calls`, every call in doubt reruns. The decision is a signed claim naming
    `operator`, spent once by the loop's next advance or recovery.

    Raises:
        CheckpointConflict: the loop is not running or has no call in doubt (`RunHeld`: a
            live worker holds it).
        ValueError: `calls` does not decide exactly the calls in doubt, or a result does not
            fit its tool's return type (or no `registry` was given to check it).
    """
    tools = registry or Registry()
    proto = _protocol(_NoModel(), tools, checkpoints, checkpoint_key, name, lease_s=lease_s, owner=owner)
    return await proto.decide_in_doubt(run_id, operator=operator, calls=calls)


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
    proto = _protocol(_NoModel(), Registry(), checkpoints, checkpoint_key, name)
    opened = await proto.open(run_id, None, identity=False)
    return proto.driver.result(opened.cur, RunStatus(opened.status))


async def cancel_tool_loop(
    run_id: str,
    *,
    reason: str,
    checkpoints: CheckpointStore,
    checkpoint_key: bytes | Sequence[bytes] | None = None,
    operator: str | None = None,
    name: str = "tool_loop",
    lease_s: float = DEFAULT_LEASE_S,
    owner: str | None = None,
) -> LoopResult:
    """Cancel a tool loop (see `FlowRunner.cancel`).

    A loop nobody holds is cancelled at once; a loop a live worker holds gets a signed
    request its holder honours before its next model or tool call (the result is then the
    loop as it stands, ``running``).

    Raises:
        CheckpointConflict: the loop already ended.
        ValueError: `reason` is empty.
    """
    proto = _protocol(_NoModel(), Registry(), checkpoints, checkpoint_key, name, lease_s=lease_s, owner=owner)
    return await proto.cancel(run_id, reason=reason, operator=operator)
