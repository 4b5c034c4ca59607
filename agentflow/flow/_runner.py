"""`FlowRunner`: runs flows superstep by superstep, with or without a checkpoint store.

Without a store a run lives only in this process. With one, step 0 is saved before the
first superstep and a checkpoint after each superstep; every tool call goes through the
call log. Every rule of the durable sequence (claim, checks, replay, decisions) lives in
the run protocol (`agentflow.exec.run.protocol`); a flow plugs in `FlowDriver`.

A runner starts runs (run, start) and sweeps them (recover_all, wake_due, run_timers); the
verbs on a stored run (advance, recover, resume, wake, decide_in_doubt, retry, cancel, fork,
migrate) are `agentflow.exec.driven.DrivenRunner`'s, written once for every kind of run, on
the run a flow and a run id name: each holds the run's lease (`RunHeld` when a live worker
has it), signs what it decides with the operator's name, and lives once in the run protocol.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from agentflow._errors import FlowError
from agentflow._identity import RunContext, identity_body
from agentflow.exec import Executor
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.driven import DrivenRunner
from agentflow.exec.run.keys import sealer_for
from agentflow.exec.run.lease import DEFAULT_LEASE_S, Ownership
from agentflow.exec.run.protocol import MAX_CHECKPOINT_BYTES, RunProtocol
from agentflow.flow import _recover, _timers
from agentflow.flow._driver import Cursor, FlowDriver, FlowProtocol
from agentflow.flow._graph import Flow
from agentflow.flow._result import RunResult
from agentflow.flow._versions import FlowLike, as_versions
from agentflow.flow.children import ChildRuns, InlineChildren

S = TypeVar("S", bound=BaseModel)


def new_run_id() -> str:
    """An unguessable run id (a run id is the only key a shared store has)."""
    return "run-" + secrets.token_urlsafe(16)


class FlowRunner(DrivenRunner[Cursor, RunResult[Any], "FlowLike[Any]", str]):
    """Runs flows; with `checkpoints`, every run survives the death of its worker.

    A run is named by its flow and its id: ``runner.recover(flow, run_id)``. The verbs on
    stored runs (advance, recover, resume, wake, decide_in_doubt, retry, cancel, fork,
    migrate, read) are `DrivenRunner`'s, written once for every kind of run.
    """

    def __init__(
        self,
        executor: Executor,
        *,
        checkpoints: CheckpointStore | None = None,
        checkpoint_key: bytes | Sequence[bytes] | None = None,
        recover_concurrency: int = 8,
        max_checkpoint_bytes: int = MAX_CHECKPOINT_BYTES,
        lease_s: float = DEFAULT_LEASE_S,
        owner: str | None = None,
        identity: str | None = None,
    ) -> None:
        """Build a runner.

        Args:
            executor: runs the tool calls (its `events` hub and its `tracer` are the runner's too).
            checkpoints: a checkpoint store; None runs without durability.
            checkpoint_key: the signing key (32+ bytes), or a list for rotation (newest
                first). Required with any store but the memory one.
            recover_concurrency: how many runs `recover_all` recovers at once.
            max_checkpoint_bytes: the largest checkpoint (encoded) a run may save; a bigger
                one raises `CheckpointTooLarge` and nothing is stored. A tool result over it
                is not stored either: its call is then in doubt (``unrecordable``).
            lease_s: how long the runner's hold on a run lasts unless renewed (it renews
                every third of it while it works). Nothing else acts on a run while its
                lease is live; a holder that died is taken over this long after.
            owner: names this runner in leases and checkpoints (default
                ``runner@<host>:<pid>``).
            identity: instead of `owner`, a name this process keeps across its restarts
                (one live process per identity, e.g. ``billing-api-0``). Its leases are
                held as ``<identity>#<start>``, and after a crash the restarted process
                takes over the runs its earlier life held at once, instead of waiting
                `lease_s` for its own leases to lapse (docs/operating.md).

        Raises:
            ValueError, TypeError: a missing or short key, a `lease_s` that is not positive,
                or both `owner` and `identity`.
        """
        self.executor = executor
        self.events = executor.events
        self.checkpoints = checkpoints
        self.sealer = sealer_for(checkpoints, checkpoint_key)
        self.recover_concurrency = recover_concurrency
        if max_checkpoint_bytes < 1024:
            raise ValueError(f"max_checkpoint_bytes must be at least 1024, not {max_checkpoint_bytes}")
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.ownership = Ownership.chosen(owner, identity, lease_s)
        #: How `Child` nodes carry their child runs on: here, to their end or first pause (a distributed
        #: deployment starts them and leaves them to its workers).
        self.children: ChildRuns = InlineChildren()

    def protocol(self, flow: FlowLike[Any]) -> FlowProtocol:
        """The run protocol for runs of `flow` (one version, or several) on this runner's store.

        Raises:
            FlowError: a version of the flow is invalid for this runner's registry.
        """
        flows = as_versions(flow)
        for version in flows:
            version.validate(self.executor.registry)
        driver = FlowDriver(flows, self.executor, None, self)
        return RunProtocol(
            driver,
            self.checkpoints,
            self.sealer,
            self.executor.registry,
            self.events,
            self.max_checkpoint_bytes,
            self.ownership,
            self.executor.tracer,
        )

    async def _target(self, flow: FlowLike[Any], run_id: str) -> tuple[FlowProtocol, str]:
        return self.protocol(flow), run_id

    def fresh_run_id(self) -> str:
        """A new unguessable run id (`new_run_id`)."""
        return new_run_id()

    async def run(
        self,
        flow: FlowLike[S],
        state: S | Mapping[str, Any],
        *,
        run_id: str | None = None,
        ctx: RunContext | None = None,
        max_supersteps: int | None = None,
    ) -> RunResult[S]:
        """Start a run and drive it until it ends or pauses.

        Args:
            flow: the flow to run (given several versions, the newest).
            state: its initial state (a model instance or a dict).
            run_id: the run's id; unguessable by default.
            ctx: who the run acts for.
            max_supersteps: stop after this many supersteps, leaving the run ``running``
                for another worker (0: only save step 0).

        Raises:
            FlowError: the flow is invalid, the state does not fit, or the run cannot go on.
            CheckpointConflict: the run id is taken, or another worker took the run over
                (`RunHeld`: a live holder has the run id).
        """
        proto = self.protocol(flow)
        newest: Flow[S] = as_versions(flow).newest
        start = _coerce_state(newest, state)
        rid = run_id if run_id is not None else new_run_id()
        if not rid or not isinstance(rid, str):
            raise ValueError("run_id must be a non-empty string")
        cur = Cursor(rid, identity_body(self.sealer, rid, ctx), ctx, newest, start, [newest.entry], {}, 0)
        result: RunResult[S] = await proto.begin(cur, max_supersteps)
        return result

    async def start(
        self,
        flow: FlowLike[S],
        state: S | Mapping[str, Any],
        *,
        run_id: str | None = None,
        ctx: RunContext | None = None,
    ) -> RunResult[S]:
        """Save a new run's step 0 without running it (a worker then advances it).

        Raises:
            ValueError: the runner has no store.
            CheckpointConflict: the run id is taken.
        """
        if self.checkpoints is None:
            raise ValueError("start needs a FlowRunner with a checkpoint store")
        return await self.run(flow, state, run_id=run_id, ctx=ctx, max_supersteps=0)

    async def recover_all(
        self, flow: FlowLike[S], *, rerun_in_doubt: bool = False, sweep: bool = False
    ) -> dict[str, RunResult[S] | BaseException]:
        """Recover every unfinished run of `flow`: each run id maps to its result or its error.

        A run a live worker holds maps to `RunHeld` (naming the holder and when its lease
        ends) and is not touched. A run held by an earlier life of this runner's `identity`
        is recovered at once, its lease taken over, as `recover` does.

        Args:
            flow: the flow whose runs to recover.
            rerun_in_doubt: rerun calls in doubt even if their tools are not idempotent.
            sweep: first look for runs the store's listing index forgot (someone deleted
                their entry; their rows remain), by scanning the stored rows themselves.
                Each one whose newest checkpoint checks is listed again and recovered; one
                that fails its check is reported as `CheckpointStoreCorrupt`. Every run
                found this way is reported with a ``run.unlisted`` event. A scan reads
                every run id of the store: use it on start-up or on a slow schedule.
        """
        return await _recover.recover_all(self, flow, rerun_in_doubt=rerun_in_doubt, sweep=sweep)

    async def wake_due(self, flow: FlowLike[Any], *, now: float | None = None) -> dict[str, Any]:
        """Wake every paused run of `flow` whose timer is due (one pass); each maps to its result or its error."""
        return await _timers.wake_due(self, flow, now=now)

    async def run_timers(self, flow: FlowLike[Any], *, every_s: float = 1.0) -> None:
        """Wake `flow`'s due runs every `every_s` seconds until cancelled (the in-process sweeper).

        Run it as a task beside your runner (``asyncio.create_task(runner.run_timers(flow))``);
        a run then wakes at most `every_s` after its time.
        """
        await _timers.run_timers(self, flow, every_s=every_s)


def _coerce_state(flow: Flow[S], state: S | Mapping[str, Any]) -> S:
    if isinstance(state, flow.state):
        return state.model_copy(deep=True)
    if isinstance(state, Mapping):
        try:
            return flow.state.model_validate(dict(state))
        except ValidationError as exc:
            raise FlowError(
                f"flow {flow.name!r}: the initial state does not fit {flow.state.__name__}: {exc}"
            ) from None
    raise FlowError(
        f"flow {flow.name!r}: the state must be a {flow.state.__name__} or a dict, not {type(state).__name__}"
    )
