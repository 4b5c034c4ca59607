"""Flow runs in the run protocol: the flow's cursor, its checkpoint body, and the superstep loop.

A flow checkpoint body holds, besides the envelope every run carries (identity, pending
approvals, decisions not yet spent, the log marker and pins): the state, the frontier,
the visits, the superstep number, the flow's version and its graph digest. `FlowDriver`
is what a flow plugs into `agentflow.exec.run.protocol.RunProtocol`; the protocol owns the
rest.

A driver holds every version at hand of its flow (`FlowVersions`): reading a checkpoint
picks the version the run is signed with (`VersionNotDeployed` when it is not at hand;
nothing is written then), and the cursor carries that version's `Flow` from then on. A
driver made for a `Migration` reads a run of any version and builds its cursor on the
migration's target instead (`agentflow.flow._migrate`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ValidationError

from agentflow._errors import AgentflowError, CheckpointError, FlowError
from agentflow._identity import RunContext
from agentflow._run_types import RunKind, RunStatus, version_of
from agentflow.exec import Executor
from agentflow.exec.calls.read import CallState
from agentflow.exec.checkpoints import CheckpointStore, SealedCheckpoint
from agentflow.exec.run.cancel import CancelRequested
from agentflow.exec.run.cursor import RunCursor
from agentflow.exec.run.driver import RunDriver
from agentflow.exec.run.protocol import RunProtocol
from agentflow.exec.run.steps import RunSteps
from agentflow.exec.seal import Sealer
from agentflow.flow._fork import patched
from agentflow.flow._graph import Call, Flow
from agentflow.flow._nodes import Child
from agentflow.flow._result import RunResult
from agentflow.flow._superstep import run_superstep
from agentflow.flow._timers import approval_deadline, settle_deadline

if TYPE_CHECKING:
    from agentflow.flow._runner import FlowRunner
from agentflow.exec.seal import check_storable
from agentflow.flow._versions import FlowVersions


@dataclass(frozen=True)
class Migration:
    """Where a migrated run goes: the target version, its state from the old one, its next nodes."""

    to: Flow[Any]
    """The version the run moves to."""
    state: Callable[[dict[str, Any]], BaseModel | Mapping[str, Any]] | None
    """The new state from the old one (its JSON form); None: the old state as it is."""
    at: str | None
    """The node the run goes on from; None: the nodes it would have run next."""


@dataclass
class Cursor(RunCursor):
    """One worker's hold on a flow run between supersteps."""

    flow: Flow[Any]
    """The run's flow."""
    state: BaseModel
    """The state after the last superstep."""
    frontier: list[str]
    """The nodes of the next superstep."""
    visits: dict[str, int]
    """How often each node ran."""
    superstep: int
    """Supersteps done."""
    detours: dict[str, str] = field(default_factory=dict)
    """Nodes whose approval deadline passed, and where the run goes on from instead (a ``wake`` claim's)."""
    parent: dict[str, Any] | None = None
    """A child run's signed lineage: the parent run, node and superstep that started it (None: no parent)."""


FlowProtocol = RunProtocol[Cursor, RunResult[Any]]


class FlowDriver(RunDriver[Cursor, RunResult[Any]]):
    """A flow, as the run protocol drives it."""

    kind: ClassVar[RunKind] = RunKind.FLOW
    noun: ClassVar[str] = "flow run"

    def __init__(
        self,
        flows: FlowVersions[Any],
        executor: Executor,
        migration: Migration | None = None,
        runner: FlowRunner | None = None,
    ) -> None:
        self.flows = flows
        self.runner = runner
        """The runner whose protocol this is: a `Child` node starts its child run through it."""
        self.executor = executor
        self.events = executor.events
        self.migration = migration

    @property
    def column(self) -> str:
        """The flow's name."""
        return self.flows.name

    # -- the checkpoint body ----------------------------------------------------------

    async def read(
        self, store: CheckpointStore, sealer: Sealer, run_id: str, row: SealedCheckpoint | None
    ) -> tuple[SealedCheckpoint, dict[str, Any]]:
        """Load (unless given) and check the latest checkpoint: signature, kind, flow, version, graph digest.

        Raises:
            VersionNotDeployed: the run's version is not at hand (unless migrating).
            FlowError: its version's graph changed since the checkpoint (unless migrating).
        """
        if row is None:
            row = await store.latest(run_id)
        body = sealer.open_checkpoint(row, run_id)
        self.owns(run_id, row, body)
        if self.migration is not None:
            return row, body  # a migration reads any version: the run leaves it
        flow = self.flows.for_run(run_id, version_of(body))
        if body.get("digest") != flow.digest:
            raise FlowError(
                f"flow {flow.name!r} version {flow.version!r} changed since run {run_id!r} was checkpointed "
                "(graph digest differs); recover it with the flow it was started with, or give the changed "
                "flow a new version and migrate the run to it"
            )
        return row, body

    def cursor(self, row: SealedCheckpoint, body: dict[str, Any], ctx: RunContext | None) -> Cursor:
        """Rebuild a cursor from a checked checkpoint (on the migration's target, when migrating)."""
        if self.migration is not None:
            return self._migrated(row, body, ctx, self.migration)
        flow = self.flows.for_run(row.run_id, version_of(body))
        return Cursor(
            row.run_id,
            dict(body["identity"]),
            ctx,
            flow,
            flow.state.model_validate(body["state"]),
            [str(n) for n in body["frontier"]],
            {str(k): int(v) for k, v in body["visits"].items()},
            int(body["superstep"]),
            {str(k): str(v) for k, v in body.get("detours", {}).items()},
            dict(body["parent"]) if isinstance(body.get("parent"), dict) else None,
        )

    def _migrated(
        self, row: SealedCheckpoint, body: dict[str, Any], ctx: RunContext | None, migration: Migration
    ) -> Cursor:
        """The cursor of a run moved onto `migration.to`: its state mapped and validated, its frontier checked."""
        flow, where = migration.to, f"run {row.run_id!r} cannot move to version {migration.to.version!r}"
        old = dict(body["state"])
        try:
            mapped = old if migration.state is None else migration.state(old)
        except Exception as exc:
            raise FlowError(f"{where}: the state function raised {type(exc).__name__}: {exc}") from None
        try:
            state = mapped if isinstance(mapped, flow.state) else flow.state.model_validate(mapped)
        except ValidationError as exc:
            raise FlowError(f"{where}: its state does not fit {flow.state.__name__} ({exc})") from None
        frontier = [migration.at] if migration.at is not None else [str(n) for n in body["frontier"]]
        unknown = [n for n in frontier if n not in flow.nodes]
        if unknown:
            raise FlowError(
                f"{where}: version {flow.version!r} has no node {', '.join(map(repr, unknown))}; "
                f"say where it goes on with at= (nodes: {', '.join(flow.nodes)})"
            )
        visits = {str(k): int(v) for k, v in body["visits"].items() if k in flow.nodes}
        return Cursor(row.run_id, dict(body["identity"]), ctx, flow, state, frontier, visits, int(body["superstep"]))

    def migrating(self, to_version: str | None, state: Any, at: str | None) -> FlowDriver:
        """This flow's driver for a move onto version `to_version` (None: the newest at hand).

        Raises:
            FlowError: the version is not at hand, or it is invalid for the registry.
        """
        flows = self.flows
        target = flows.newest if to_version is None else flows.get(to_version)
        if target is None:
            raise FlowError(
                f"flow {flows.name!r} has no version {to_version!r} here (versions: {', '.join(flows.versions)})"
            )
        target.validate(self.executor.registry)
        return FlowDriver(flows, self.executor, Migration(target, state, at), self.runner)

    async def children(self, steps: RunSteps[Cursor, RunResult[Any]], run_id: str) -> list[tuple[FlowProtocol, str]]:
        """The child runs a paused run waits for (its `Child` nodes' runs), each with its flow's protocol."""
        if self.runner is None:
            return []
        try:
            opened = await steps.open(run_id, None, identity=False)
        except AgentflowError:
            return []  # nothing readable to cascade from: the run's own cancel says what is wrong
        wake = opened.cur.wake
        if opened.status != RunStatus.PAUSED or wake is None or wake.get("for") != "child":
            return []
        found: list[tuple[FlowProtocol, str]] = []
        for node in opened.cur.flow.nodes.values():
            if isinstance(node.action, Child):
                prefix = f"{run_id}.{node.name}."
                proto = self.runner.protocol(node.action.flow)
                found += [(proto, str(child)) for child in wake["runs"] if str(child).startswith(prefix)]
        return found

    def migration_record(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The versions a migrated run moves from and to, and the node it goes on from (None: where it was)."""
        if self.migration is None:
            return super().migration_record(body)
        return {"from": version_of(body), "to": self.migration.to.version, "at": self.migration.at}

    def fields(self, cur: Cursor) -> dict[str, Any]:
        """State, frontier, visits, superstep, the flow's version and its graph digest."""
        try:
            check_storable(cur.state, "state")
            state = cur.state.model_dump(mode="json")
        except Exception as exc:
            raise FlowError(f"flow {cur.flow.name!r}: the state cannot be stored as JSON: {exc}") from None
        fields = {
            "version": cur.flow.version,
            "digest": cur.flow.digest,
            "state": state,
            "frontier": cur.frontier,
            "visits": cur.visits,
            "superstep": cur.superstep,
        }
        fields |= {"detours": dict(cur.detours)} if cur.detours else {}
        return fields | ({"parent": dict(cur.parent)} if cur.parent else {})

    def woken(self, cur: Cursor, wake: Mapping[str, Any]) -> dict[str, Any]:
        """Settle what a due timer decides (`agentflow.flow._timers.settle_deadline`)."""
        if wake.get("for") == "approval":
            return settle_deadline(cur, wake)
        return super().woken(cur, wake)

    def forked(
        self, source: Cursor, run_id: str, identity: dict[str, Any], ctx: RunContext | None, patch: Any
    ) -> Cursor:
        """A new run from `source`: its state with `patch` applied (`_fork.patched`), its frontier and visits.

        The new run is on the flow version the source checkpoint was saved on.

        Raises:
            FlowError: the patch names a field the state does not have, or the patched state does not fit.
        """
        flow = source.flow
        state = patched(flow, source.state, patch)
        return Cursor(run_id, identity, ctx, flow, state, list(source.frontier), dict(source.visits), source.superstep)

    def event_fields(self, cur: Cursor) -> dict[str, Any]:
        """The flow's name."""
        return {"flow": cur.flow.name}

    def superstep(self, cur: Cursor) -> int:
        """Supersteps done."""
        return cur.superstep

    def result(
        self, cur: Cursor, status: RunStatus, replayed: list[str] | None = None, rerun: list[str] | None = None
    ) -> RunResult[Any]:
        """The run as it stands."""
        parent = cur.parent.get("run") if cur.parent else None
        return RunResult(
            cur.run_id, status, cur.state, **cur.outcome(replayed, rerun), version=cur.flow.version, parent=parent
        )

    # -- the superstep loop -----------------------------------------------------------

    async def drive(
        self,
        proto: RunSteps[Cursor, RunResult[Any]],
        cur: Cursor,
        seeds: Mapping[str, CallState],
        *,
        limit: int | None,
        recovering: bool,
    ) -> RunResult[Any]:
        """Run supersteps from the cursor until the run ends, pauses, or `limit` supersteps ran (each in its span)."""
        replayed: list[str] = []
        rerun: list[str] = []
        ran = 0
        while limit is None or ran < limit:
            ran += 1
            if ran == 1 and cur.watch is not None:  # a boundary: a cancel request stops the run before it starts
                await cur.watch.check(boundary=True)
            with proto.step_span(cur):
                ended = await self._superstep(proto, cur, seeds, recovering, replayed, rerun)
            if ended is not None:
                return ended
            seeds, recovering = {}, False
        return self.result(cur, RunStatus.RUNNING, replayed, rerun)

    async def _superstep(
        self,
        proto: RunSteps[Cursor, RunResult[Any]],
        cur: Cursor,
        seeds: Mapping[str, CallState],
        recovering: bool,
        replayed: list[str],
        rerun: list[str],
    ) -> RunResult[Any] | None:
        """Run one superstep and save its checkpoint; the result if the run ended or paused, else None."""
        log = cur.call_log(self.executor, cur.superstep, seeds)
        lone = cur.frontier[0] if len(cur.frontier) == 1 else None
        if lone is not None and isinstance(cur.flow.nodes[lone].action, Call):
            log.closes_with(lone, 1)  # a lone `Call` node returns as soon as its one call does: only the merge follows
        try:
            out = await run_superstep(
                cur.flow, cur.state, cur.frontier, cur.visits, log, self.events, cur.detours, self.runner
            )
        except (CheckpointError, CancelRequested):
            raise  # the store refused a write or failed, or the run is being cancelled: the protocol ends it
        except FlowError as exc:
            await self._fail(proto, cur, exc)
            raise
        except Exception as exc:
            return await self._fail(proto, cur, exc, replayed + log.replayed, rerun + log.rerun)
        if cur.watch is not None:  # a boundary: once a request is seen, nothing of this superstep is kept
            await cur.watch.step_ended()
        replayed += log.replayed
        rerun += log.rerun
        recovered = proto.report_step(cur, log.replayed, log.rerun, recovering)
        if out.paused:
            cur.pending = list(log.pending)
            cur.wake = approval_deadline(cur.flow, cur.pending, time.time())
            if out.children:  # due once a child ended (`agentflow.exec.run.timers`)
                cur.wake = {"at": time.time(), "for": "child", "runs": list(out.children)}
            await proto.save(cur, RunStatus.PAUSED, unreplayed=log.unreplayed, recovered=recovered)
            self.events.emit("run.paused", cur.run_id, pending=[p.call_id for p in cur.pending], wake=cur.wake)
            return self.result(cur, RunStatus.PAUSED, replayed, rerun)
        cur.state, cur.frontier, cur.visits = out.state, out.frontier, out.visits
        cur.superstep += 1
        cur.decisions, cur.pending, cur.detours = {}, [], {}
        status = RunStatus.RUNNING if cur.frontier else RunStatus.DONE
        if status is RunStatus.RUNNING and out.wake_at is not None and out.wake_at > time.time():
            cur.wake, status = {"at": out.wake_at, "for": "timer"}, RunStatus.PAUSED  # a `Wait`: nothing is held
        finished = (
            proto.ending_event("run.finished", cur.run_id, flow=cur.flow.name, status=status.value)
            if status is RunStatus.DONE
            else None
        )
        await proto.save(cur, status, unreplayed=log.unreplayed, recovered=recovered, ending=finished)
        if status is RunStatus.PAUSED:
            self.events.emit("run.waiting", cur.run_id, until=out.wake_at)
            return self.result(cur, status, replayed, rerun)
        if status is RunStatus.DONE:
            return self.result(cur, status, replayed, rerun)
        return None

    async def _fail(
        self,
        proto: RunSteps[Cursor, RunResult[Any]],
        cur: Cursor,
        exc: BaseException,
        replayed: list[str] | None = None,
        rerun: list[str] | None = None,
    ) -> RunResult[Any]:
        cur.error = f"{type(exc).__name__}: {exc}"
        cur.pending = []
        finished = proto.ending_event("run.finished", cur.run_id, flow=cur.flow.name, status="failed", error=cur.error)
        await proto.save(cur, RunStatus.FAILED, ending=finished)
        return self.result(cur, RunStatus.FAILED, replayed, rerun)
