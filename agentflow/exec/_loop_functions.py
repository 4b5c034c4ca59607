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

`LoopRunner` (`_loop_runner`) holds every operation on a loop (start, advance, resume,
wake, decide_in_doubt, cancel, read, ...). The two functions here are the ones DESIGN.md
names, each one use of it for a caller that has no runner at hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agentflow._events import Events
from agentflow._identity import RunContext
from agentflow.exec._executor import Approver
from agentflow.exec._loop_engine import LoopResult
from agentflow.exec._loop_runner import LoopRunner
from agentflow.exec._registry import Registry
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.lease import DEFAULT_LEASE_S
from agentflow.exec.tracing import Tracer
from agentflow.models import Message, Model

__all__ = ["recover_tool_loop", "run_tool_loop"]


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
    runner = LoopRunner(
        model,
        registry,
        checkpoints=checkpoints,
        checkpoint_key=checkpoint_key,
        name=name,
        approver=approver,
        events=events,
        lease_s=lease_s,
        owner=owner,
        tracer=tracer,
    )
    return await runner.run(messages, run_id=run_id, max_steps=max_steps, ctx=ctx, approve=approve, note=note)


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
    runner = LoopRunner(
        model,
        registry,
        checkpoints=checkpoints,
        checkpoint_key=checkpoint_key,
        name=name,
        approver=approver,
        events=events,
        lease_s=lease_s,
        owner=owner,
        tracer=tracer,
    )
    return await runner.recover(run_id, rerun_in_doubt=rerun_in_doubt, ctx=ctx, operator=operator)
