"""Flow checkpoints: what a worker holds of a run (`Cursor`) and how it is saved and loaded.

A checkpoint body holds everything needed to go on from a superstep boundary: state,
frontier, visits, superstep number, graph digest, identity (principal only as a proof),
pending approval requests, decisions not yet spent, and ``log``: how many call records
this segment had when it was saved (so records cut from before it are caught).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from agentflow._errors import CheckpointConflict, CheckpointStoreCorrupt, FlowError
from agentflow._events import Events
from agentflow._identity import RunContext
from agentflow.exec._durable import Decision, Journal, envelope, read_decisions, read_pending
from agentflow.exec._durable_seal import Sealer
from agentflow.exec._executor import ApprovalRequest
from agentflow.exec.checkpoints._protocol import CheckpointStore
from agentflow.exec.checkpoints._records import SealedCheckpoint
from agentflow.flow._graph import Flow

BODY_VERSION = 1


@dataclass
class Cursor:
    """One worker's hold on a run between supersteps."""

    flow: Flow[Any]
    run_id: str
    state: BaseModel
    frontier: list[str]
    visits: dict[str, int]
    superstep: int
    identity: dict[str, Any]
    ctx: RunContext | None
    step: int | None = None
    """The last step this worker saved or read (None before step 0)."""
    journal: Journal | None = None
    decisions: dict[str, Decision] = field(default_factory=dict)
    pending: list[ApprovalRequest] = field(default_factory=list)
    error: str | None = None


class Checkpointer:
    """Saves and loads a flow's checkpoints; without a store it saves nothing."""

    def __init__(self, store: CheckpointStore | None, sealer: Sealer | None, events: Events) -> None:
        self.store = store
        self.sealer = sealer
        self.events = events

    def journal(self, run_id: str, segment: int, next_seq: int = 0) -> Journal | None:
        """A journal for a segment of the run, new or continued at `next_seq` (None without a store)."""
        if self.store is None or self.sealer is None:
            return None
        return Journal(self.store, self.sealer, run_id, segment, next_seq)

    def body(self, cur: Cursor, recovered: dict[str, Any] | None = None) -> dict[str, Any]:
        """The checkpoint body for the cursor as it stands."""
        try:
            state = cur.state.model_dump(mode="json")
        except Exception as exc:
            raise FlowError(f"flow {cur.flow.name!r}: the state cannot be stored as JSON: {exc}") from None
        body: dict[str, Any] = {
            "v": BODY_VERSION,
            "kind": "flow",
            "digest": cur.flow.digest,
            "state": state,
            "frontier": cur.frontier,
            "visits": cur.visits,
            "superstep": cur.superstep,
            **envelope(cur.identity, cur.pending, cur.decisions, cur.journal, cur.error),
        }
        if recovered is not None:
            body["recovered"] = recovered
        return body

    async def save(
        self,
        cur: Cursor,
        status: str,
        *,
        segment: int | None = None,
        claim: str | None = None,
        unreplayed: list[str] | None = None,
        recovered: dict[str, Any] | None = None,
    ) -> None:
        """Save the next checkpoint of the run (a compare-and-set on the step).

        Args:
            cur: the run; its `step` advances on success.
            status: the checkpoint's status.
            segment: open a new segment (a claim); by default the journal's segment.
            claim: why the run is claimed: ``recovery``, ``resume`` or ``handoff`` (signed
                into the checkpoint, so viewers can tell a recovery from routine).
            unreplayed: calls whose arguments changed since the crash (reported in the event).
            recovered: what the first superstep after a recovery replayed and reran.

        Raises:
            CheckpointConflict: another worker saved this step first, or the run ended.
        """
        step = 0 if cur.step is None else cur.step + 1
        if self.store is None or self.sealer is None:
            cur.step = None
            return
        if segment is not None:
            cur.journal = self.journal(cur.run_id, segment)
        assert cur.journal is not None
        body = self.body(cur, recovered)
        if claim is not None:
            body["claim"] = claim
        row = self.sealer.seal_checkpoint(
            cur.run_id, step, cur.flow.name, str(status), cur.journal.segment, time.time(), body
        )
        await cur.journal.save(step, row)  # with a held ``done`` record, if the superstep left one
        cur.step = step
        self.events.emit(
            "checkpoint.saved",
            cur.run_id,
            kind="flow",
            step=step,
            status=str(status),
            flow=cur.flow.name,
            unreplayed=list(unreplayed or ()),
        )

    async def load(
        self, flow: Flow[Any], run_id: str, row: SealedCheckpoint | None = None
    ) -> tuple[SealedCheckpoint, dict[str, Any]]:
        """Load (unless `row` was read already), check and decode the run's latest checkpoint.

        Raises:
            CheckpointNotFound: nothing is stored for the run.
            CheckpointStoreCorrupt: the row fails its signature.
            CheckpointConflict: the run belongs to another flow.
            FlowError: the graph changed since the checkpoint.
        """
        assert self.store is not None and self.sealer is not None
        if row is None:
            row = await self.store.latest(run_id)
        body = self.sealer.open_checkpoint(row, run_id)
        if body.get("kind") != "flow":
            raise FlowError(f"run {run_id!r} is a {body.get('kind')!r} run, not a flow run")
        if row.flow != flow.name:
            raise CheckpointConflict(f"run {run_id!r} belongs to flow {row.flow!r}, not {flow.name!r}")
        if body.get("digest") != flow.digest:
            raise FlowError(
                f"flow {flow.name!r} changed since run {run_id!r} was checkpointed (graph digest differs); "
                "recover it with the flow it was started with"
            )
        return row, body

    def cursor(self, flow: Flow[Any], row: SealedCheckpoint, body: dict[str, Any], ctx: RunContext | None) -> Cursor:
        """Rebuild a cursor from a checked checkpoint."""
        try:
            return Cursor(
                flow=flow,
                run_id=row.run_id,
                state=flow.state.model_validate(body["state"]),
                frontier=list(body["frontier"]),
                visits=dict(body["visits"]),
                superstep=int(body["superstep"]),
                identity=dict(body["identity"]),
                ctx=ctx,
                step=row.step,
                decisions=read_decisions(body),
                pending=read_pending(body, ctx),
                error=body.get("error"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointStoreCorrupt(
                f"checkpoint {row.step} of run {row.run_id!r} is signed but does not fit flow {flow.name!r}: {exc}"
            ) from None
