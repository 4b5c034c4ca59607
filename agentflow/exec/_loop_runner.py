"""`LoopRunner`: runs the tool loops of one name, the way `FlowRunner` runs flows.

A tool loop is a run like a flow run: the same protocol (`run.protocol`) holds, checks
and saves it, and it has the same operations (run, start, advance, recover, resume, wake,
decide_in_doubt, cancel, fork, read). What a loop plugs in is `LoopDriver` (`_loop_engine`).
A runner is built once from what every operation shares (model, tools, store, key, lease,
owner, hub, tracer) and holds one protocol; `run_tool_loop` and `recover_tool_loop`
(`_loop_functions`) are one-line uses of it.

The model is only needed by the operations that call it (`run`, `advance`, `recover`,
`wake`, and a `resume` that carries the loop on): a runner built without one stores
decisions, cancels and reads, and refuses to call a model with a clear error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agentflow._errors import CheckpointConflict
from agentflow._events import Events
from agentflow._identity import RunContext, identity_body
from agentflow._run_types import RunStatus
from agentflow.exec._executor import Approver, Executor
from agentflow.exec._loop_engine import LoopCursor, LoopDriver, LoopProtocol, LoopResult
from agentflow.exec._registry import Registry
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.driven import ProtocolRunner
from agentflow.exec.run.keys import sealer_for
from agentflow.exec.run.lease import DEFAULT_LEASE_S, Ownership
from agentflow.exec.run.protocol import MAX_CHECKPOINT_BYTES, RunProtocol
from agentflow.exec.seal import Sealer
from agentflow.exec.tracing import Tracer
from agentflow.models import Message, Model

__all__ = ["HoldsRuns", "LoopRunner"]


class HoldsRuns(Protocol):
    """What a runner shares with a `LoopRunner` beside it (`FlowRunner` has it all)."""

    checkpoints: CheckpointStore | None
    sealer: Sealer | None
    ownership: Ownership
    events: Events
    executor: Executor
    max_checkpoint_bytes: int


class LoopRunner(ProtocolRunner[LoopCursor, LoopResult]):
    """Runs the tool loops called `name`; with `checkpoints`, every loop survives the death of its worker.

    The verbs on stored loops (advance, recover, resume, wake, decide_in_doubt, cancel, fork,
    read) are `DrivenRunner`'s; retry and migrate are refused with the reason (`LoopDriver.refused`).
    """

    def __init__(
        self,
        model: Model | None,
        registry: Registry,
        *,
        checkpoints: CheckpointStore | None = None,
        checkpoint_key: bytes | Sequence[bytes] | None = None,
        name: str = "tool_loop",
        approver: Approver | None = None,
        events: Events | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        owner: str | None = None,
        identity: str | None = None,
        tracer: Tracer | None = None,
        max_checkpoint_bytes: int = MAX_CHECKPOINT_BYTES,
    ) -> None:
        """Build a runner.

        Args:
            model: the model the loops call (see `agentflow.models`); None for a runner
                that only stores decisions, cancels and reads.
            registry: the tools the model may call.
            checkpoints: a checkpoint store (None: not durable).
            checkpoint_key: the signing key (required with any store but the memory one).
            name: the loops' name (runs are listed under ``loop:<name>``).
            approver: a synchronous approval port (else calls needing approval pause the run).
            events: an event hub to report to.
            lease_s: how long this runner's hold on a loop lasts unless renewed (renewed every
                third of it while the loop works); nothing else acts on the loop meanwhile.
            owner: names this runner in leases and checkpoints (default ``runner@<host>:<pid>``).
            identity: instead of `owner`, a name this process keeps across its restarts
                (see `FlowRunner`).
            tracer: where the loops report their spans (`agentflow.observe.Tracing`; off by default).
            max_checkpoint_bytes: the largest checkpoint (encoded) a loop may save (see `FlowRunner`).

        Raises:
            ValueError, TypeError: a missing or short key, a `lease_s` that is not positive,
                or both `owner` and `identity`.
        """
        if max_checkpoint_bytes < 1024:
            raise ValueError(f"max_checkpoint_bytes must be at least 1024, not {max_checkpoint_bytes}")
        self._setup(
            model,
            Executor(registry, approver=approver, events=events, tracer=tracer),
            checkpoints,
            sealer_for(checkpoints, checkpoint_key),
            Ownership.chosen(owner, identity, lease_s),
            name,
            max_checkpoint_bytes,
        )

    @classmethod
    def beside(cls, runner: HoldsRuns, model: Model | None, registry: Registry, *, name: str) -> LoopRunner:
        """A runner for the loops `name` that shares `runner`'s store, key ring, hold, event hub and tracer.

        One process that runs flows and loops (a worker, the CLI, the viewer) holds every run
        under one name: a loop's lease and a flow's are this process's alike.
        """
        loops = cls.__new__(cls)
        executor = Executor(registry, events=runner.events, tracer=runner.executor.tracer)
        loops._setup(
            model, executor, runner.checkpoints, runner.sealer, runner.ownership, name, runner.max_checkpoint_bytes
        )
        return loops

    def _setup(
        self,
        model: Model | None,
        executor: Executor,
        checkpoints: CheckpointStore | None,
        sealer: Sealer | None,
        ownership: Ownership,
        name: str,
        max_checkpoint_bytes: int,
    ) -> None:
        self.name = name
        self.checkpoints = checkpoints
        self.executor = executor
        self.events = executor.events
        self.ownership = ownership
        self.sealer = sealer
        driver = LoopDriver(model if model is not None else _NoModel(name), self.executor, name)
        self.protocol: LoopProtocol = RunProtocol(
            driver,
            checkpoints,
            self.sealer,
            executor.registry,
            self.events,
            max_checkpoint_bytes,
            ownership,
            executor.tracer,
        )

    def _cursor(
        self, run_id: str | None, messages: Sequence[Message] | None, max_steps: int, ctx: RunContext | None
    ) -> LoopCursor:
        """A new loop's cursor, before its step 0 is saved."""
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, not {max_steps}")
        if not messages:
            raise ValueError("a new tool loop needs the messages to start from")
        rid = run_id if run_id is not None else self.fresh_run_id()
        if not rid or not isinstance(rid, str):
            raise ValueError("run_id must be a non-empty string")
        return LoopCursor(rid, identity_body(self.sealer, rid, ctx), ctx, list(messages), max_steps)

    async def run(
        self,
        messages: Sequence[Message] | None = None,
        *,
        run_id: str | None = None,
        max_steps: int = 10,
        ctx: RunContext | None = None,
        approve: bool | Mapping[str, bool] | None = None,
        note: str | None = None,
    ) -> LoopResult:
        """Run a loop: ask the model, run the tools it asks for, repeat until it answers.

        With a store, the history is checkpointed after each model reply and after the
        tool results. Given the `run_id` of a loop paused for an approval, it resumes that
        loop: `approve` decides the pending calls (None returns it as it stands, paused).
        A run retried with the same `run_id`, `messages`, `max_steps` and `ctx` (its first try
        raised, `StoreNotDurable` among the errors, or its answer was lost) attaches to the
        loop the first try stored (`RunProtocol.begin`): it carries it on as `recover` does,
        or returns it as it stands if it ended or paused.

        Args:
            messages: the conversation to start from (not needed to resume).
            run_id: the run's id; unguessable by default.
            max_steps: the most model calls the whole run may make, recoveries included.
            ctx: who the run acts for.
            approve: the decision when resuming a paused loop: one for all, or per call id.
            note: a note stored with the decision.

        Raises:
            CheckpointConflict: the run id belongs to another run, or to a loop started with other
                messages, limits or identity; or, without `messages`, to a loop that is running
                or ended (`RunHeld`: a live worker carries it on).
            ModelError: the model's reply could not be used (the run stays recoverable).
            StoreNotDurable: the store could not confirm step 0 in time: the loop may exist and
                goes on if it does; retry with the same `run_id`.
        """
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, not {max_steps}")
        resuming = messages is None or approve is not None  # else a start, perhaps retried: `begin` attaches
        if run_id is not None and self.checkpoints is not None and resuming and await self._exists(run_id):
            if approve is None:
                return await self._paused(run_id, ctx)
            return await self.resume(run_id, approve=approve, note=note, ctx=ctx)
        return await self.protocol.begin(self._cursor(run_id, messages, max_steps, ctx), None)

    async def _paused(self, run_id: str, ctx: RunContext | None) -> LoopResult:
        """A paused loop as it stands (`run` given its id and no decision)."""
        opened = await self.protocol.steps.open(run_id, ctx)
        if opened.status != RunStatus.PAUSED:
            hint = (
                "recover it: LoopRunner.recover or recover_tool_loop"
                if opened.status == RunStatus.RUNNING
                else "it ended"
            )
            raise CheckpointConflict(f"run {run_id!r} exists and is {opened.status}, not paused ({hint})")
        return self.protocol.driver.result(opened.cur, RunStatus.PAUSED)

    async def start(
        self,
        messages: Sequence[Message],
        *,
        run_id: str | None = None,
        max_steps: int = 10,
        ctx: RunContext | None = None,
    ) -> LoopResult:
        """Save a new loop's step 0 (its messages) without running it; a worker advances it.

        A start retried with the same `run_id`, `messages`, `max_steps` and `ctx` returns the
        loop its first try stored, as it stands (`RunProtocol.begin`).

        Raises:
            ValueError: the runner has no store, or no messages were given.
            CheckpointConflict: the run id is taken by another run, or by a loop started with
                other messages, limits or identity.
            StoreNotDurable: the store could not confirm step 0 in time (see `run`).
        """
        if self.checkpoints is None:
            raise ValueError("start needs a LoopRunner with a checkpoint store")
        return await self.protocol.begin(self._cursor(run_id, messages, max_steps, ctx), 0)


class _NoModel:
    """Stands in for the model of a runner built without one."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        raise RuntimeError(
            f"this LoopRunner for {self.name!r} was built without a model: build it with the loop's model "
            "to run, advance, recover or wake a loop"
        )
