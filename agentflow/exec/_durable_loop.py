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

import hashlib
import json
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentflow._errors import (
    ApprovalDenied,
    CheckpointConflict,
    CheckpointError,
    CheckpointNotFound,
    CheckpointStoreCorrupt,
    ModelError,
    ToolArgumentsInvalid,
    UnknownTool,
)
from agentflow._events import Events
from agentflow._identity import RunContext, identity_body, restore_identity
from agentflow.exec._durable import (
    CallLog,
    CallState,
    Decision,
    Journal,
    PauseForApproval,
    analyze,
    calls_in_doubt,
    check_no_later_records,
    describe_failure,
    read_log,
)
from agentflow.exec._durable_seal import Sealer, canonical, sealer_for
from agentflow.exec._executor import ApprovalRequest, Approver, Executor
from agentflow.exec._registry import Registry
from agentflow.exec.checkpoints._protocol import CheckpointStore
from agentflow.flow._result import RunStatus
from agentflow.models._messages import Message, ToolCall
from agentflow.models._protocol import Model

_EMPTY_CHAIN = hashlib.sha256(b"agentflow/history/1").hexdigest()


def chain(prev: str, message: Message) -> str:
    """Extend the history digest chain by one message."""
    return hashlib.sha256(prev.encode() + canonical(message.model_dump(mode="json"))).hexdigest()


@dataclass
class LoopResult:
    """The outcome of `run_tool_loop` or `recover_tool_loop`."""

    run_id: str
    status: RunStatus
    messages: list[Message]
    """The whole conversation, initial messages included."""
    model_calls: int
    """Model calls made over the whole run."""
    step: int | None = None
    pending: list[ApprovalRequest] = field(default_factory=list)
    error: str | None = None
    replayed: list[str] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The content of the last assistant message ("" if there is none)."""
        for message in reversed(self.messages):
            if message.role == "assistant":
                return message.content
        return ""


@dataclass
class _Loop:
    run_id: str
    flow: str
    history: list[Message]
    max_steps: int
    identity: dict[str, Any]
    ctx: RunContext | None
    stage: str = "start"
    turn: int = 0
    model_calls: int = 0
    step: int | None = None
    journal: Journal | None = None
    chain: str = _EMPTY_CHAIN
    saved_len: int = 0
    decisions: dict[str, Decision] = field(default_factory=dict)
    pending: list[ApprovalRequest] = field(default_factory=list)
    error: str | None = None


class _LoopEngine:
    def __init__(
        self,
        model: Model,
        executor: Executor,
        store: CheckpointStore | None,
        sealer: Sealer | None,
    ) -> None:
        self.model = model
        self.executor = executor
        self.events: Events = executor.events
        self.store = store
        self.sealer = sealer

    # -- checkpoints ----------------------------------------------------------------

    def _body(self, lp: _Loop, recovered: dict[str, Any] | None) -> dict[str, Any]:
        new = lp.history[lp.saved_len :]
        digest = lp.chain
        for message in new:
            digest = chain(digest, message)
        body: dict[str, Any] = {
            "v": 1,
            "kind": "loop",
            "stage": lp.stage,
            "turn": lp.turn,
            "model_calls": lp.model_calls,
            "max_steps": lp.max_steps,
            "new": [m.model_dump(mode="json") for m in new],
            "history": {"len": len(lp.history), "chain": digest},
            "identity": lp.identity,
            "pending": [{"call_id": p.call_id, "tool": p.tool, "args": p.args, "node": p.node} for p in lp.pending],
            "decisions": {k: {"approve": d.approve, "note": d.note} for k, d in lp.decisions.items()},
            "log": [lp.journal.segment, lp.journal.next_seq] if lp.journal else None,
            "error": lp.error,
        }
        if recovered is not None:
            body["recovered"] = recovered
        return body

    async def save(
        self, lp: _Loop, status: str, *, segment: int | None = None, recovered: dict[str, Any] | None = None
    ) -> None:
        if self.store is None or self.sealer is None:
            return
        step = 0 if lp.step is None else lp.step + 1
        if segment is not None:
            lp.journal = Journal(self.store, self.sealer, lp.run_id, segment)
        assert lp.journal is not None
        body = self._body(lp, recovered)
        row = self.sealer.seal_checkpoint(lp.run_id, step, lp.flow, status, lp.journal.segment, time.time(), body)
        await self.store.save(lp.run_id, step, row)
        lp.step, lp.chain, lp.saved_len = step, body["history"]["chain"], len(lp.history)
        self.events.emit(
            "checkpoint.saved", lp.run_id, kind="loop", step=step, status=status, stage=lp.stage, unreplayed=[]
        )

    async def load(self, run_id: str, flow: str, ctx: RunContext | None) -> tuple[_Loop, str, dict[str, Any]]:
        assert self.store is not None and self.sealer is not None
        rows = list(await self.store.history(run_id))
        if not rows:
            await self.store.latest(run_id)  # raises CheckpointNotFound with the store's message
        history: list[Message] = []
        digest = _EMPTY_CHAIN
        body: dict[str, Any] = {}
        for expected, row in enumerate(rows):
            body = self.sealer.open_checkpoint(row, run_id)
            if row.step != expected:
                raise CheckpointStoreCorrupt(f"run {run_id!r}: checkpoint {expected} is missing from its history")
            if body.get("kind") != "loop" or row.flow != flow:
                raise CheckpointConflict(f"run {run_id!r} is not a tool loop named {flow!r} (it is {row.flow!r})")
            for raw in body["new"]:
                message = Message.model_validate(raw)
                history.append(message)
                digest = chain(digest, message)
        last = rows[-1]
        if body["history"] != {"len": len(history), "chain": digest}:
            raise CheckpointStoreCorrupt(f"run {run_id!r}: the stored history does not match its digest chain")
        restored = restore_identity(self.sealer, run_id, body.get("identity") or {}, ctx)
        lp = _Loop(
            run_id=run_id,
            flow=flow,
            history=history,
            max_steps=int(body["max_steps"]),
            identity=dict(body["identity"]),
            ctx=restored,
            stage=str(body["stage"]),
            turn=int(body["turn"]),
            model_calls=int(body["model_calls"]),
            step=last.step,
            chain=digest,
            saved_len=len(history),
            decisions={k: Decision(bool(v["approve"]), v.get("note")) for k, v in body["decisions"].items()},
            pending=[ApprovalRequest(p["call_id"], p["tool"], p["args"], p["node"], restored) for p in body["pending"]],
            error=body.get("error"),
        )
        return lp, last.status, body

    # -- the loop -------------------------------------------------------------------

    async def drive(self, lp: _Loop, seeds: Mapping[str, CallState] | None = None) -> LoopResult:
        recovering = seeds is not None
        replayed: list[str] = []
        rerun: list[str] = []
        while True:
            if lp.stage in ("start", "tools"):
                if lp.model_calls >= lp.max_steps:
                    lp.error = f"max_steps ({lp.max_steps}) reached: the model was called {lp.model_calls} times"
                    await self.save(lp, RunStatus.FAILED)
                    return self._result(lp, RunStatus.FAILED, replayed, rerun)
                reply = await self._ask_model(lp)
                lp.history.append(reply)
                lp.stage = "model"
                status = RunStatus.RUNNING if reply.tool_calls else RunStatus.DONE
                await self.save(lp, status)
                if status is RunStatus.DONE:
                    return self._result(lp, status, replayed, rerun)
                continue
            log = CallLog(self.executor, lp.run_id, lp.turn, lp.ctx, lp.journal, seeds or {}, lp.decisions)
            results = await self._run_tools(lp, log)
            replayed += log.replayed
            rerun += log.rerun
            recovered = {"replayed": log.replayed, "rerun": log.rerun} if recovering else None
            if recovering:
                self.events.emit(
                    "run.recovered", lp.run_id, kind="loop", step=lp.step, replayed=log.replayed, rerun=log.rerun
                )
            if results is None:
                lp.pending = list(log.pending)
                await self.save(lp, RunStatus.PAUSED, recovered=recovered)
                return self._result(lp, RunStatus.PAUSED, replayed, rerun)
            lp.history.extend(results)
            lp.stage, lp.decisions, lp.pending = "tools", {}, []
            await self.save(lp, RunStatus.RUNNING, recovered=recovered)
            seeds, recovering = None, False

    async def _ask_model(self, lp: _Loop) -> Message:
        if lp.journal is not None:
            marker = {"call_id": f"{lp.turn + 1}/model", "superstep": lp.turn + 1, "model": True}
            await lp.journal.write("started", marker)
        lp.model_calls += 1
        reply = await self.model.complete(list(lp.history), self.executor.registry.schemas())
        if not isinstance(reply, Message) or reply.role != "assistant":
            raise ModelError(f"the model returned {reply!r}, not an assistant Message")
        lp.turn += 1
        return reply

    async def _run_tools(self, lp: _Loop, log: CallLog) -> list[Message] | None:
        reply = lp.history[-1]
        out: list[Message] = []
        for index, call in enumerate(reply.tool_calls):
            out.append(Message.tool(call, await self._one_tool(log, index, call)))
        return None if log.pending else out

    async def _one_tool(self, log: CallLog, index: int, call: ToolCall) -> str:
        try:
            value = await log.call("tools", index, call.name, call.arguments)
        except PauseForApproval:
            return ""
        except ApprovalDenied as exc:
            return f"denied: {exc}"
        except CheckpointError:
            raise
        except (UnknownTool, ToolArgumentsInvalid) as exc:  # refused before logging: the model can correct it
            return f"error: {exc}"
        except Exception as exc:  # the same text live and when replayed after a crash
            return f"error: {describe_failure(exc)}"
        if isinstance(value, str):
            return value
        tool = self.executor.registry.get(call.name)
        return json.dumps(tool.encode_result(value), sort_keys=True)

    @staticmethod
    def _result(
        lp: _Loop, status: RunStatus, replayed: list[str] | None = None, rerun: list[str] | None = None
    ) -> LoopResult:
        return LoopResult(
            run_id=lp.run_id,
            status=status,
            messages=list(lp.history),
            model_calls=lp.model_calls,
            step=lp.step,
            pending=list(lp.pending),
            error=lp.error,
            replayed=list(replayed or []),
            rerun=list(rerun or []),
        )


async def _seeds(engine: _LoopEngine, lp: _Loop, body: dict[str, Any], rerun_in_doubt: bool) -> dict[str, CallState]:
    assert engine.store is not None and engine.sealer is not None
    marker = body.get("log")
    records = await read_log(engine.store, engine.sealer, lp.run_id, (marker[0], marker[1]) if marker else None)
    check_no_later_records(lp.run_id, records, lp.turn, model_ahead=1)
    lp.model_calls = max(lp.model_calls, sum(1 for r in records if r.body.get("model")))
    states = analyze(records, lp.turn) if lp.stage == "model" else {}
    calls_in_doubt(lp.run_id, states, engine.executor.registry, rerun_in_doubt)
    return states


def _engine(
    model: Model,
    registry: Registry,
    checkpoints: CheckpointStore | None,
    checkpoint_key: bytes | Sequence[bytes] | None,
    approver: Approver | None,
    events: Events | None,
) -> _LoopEngine:
    executor = Executor(registry, approver=approver, events=events)
    return _LoopEngine(model, executor, checkpoints, sealer_for(checkpoints, checkpoint_key))


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
    lp = _Loop(rid, flow, list(messages), max_steps, identity_body(engine.sealer, rid, ctx), ctx)
    await engine.save(lp, RunStatus.RUNNING, segment=0)
    return await engine.drive(lp)


async def _exists(store: CheckpointStore, run_id: str) -> bool:
    try:
        await store.latest(run_id)
    except CheckpointNotFound:
        return False
    return True


async def _resume(
    engine: _LoopEngine,
    run_id: str,
    flow: str,
    approve: bool | Mapping[str, bool] | None,
    note: str | None,
    ctx: RunContext | None,
) -> LoopResult:
    lp, status, body = await engine.load(run_id, flow, ctx)
    if status != RunStatus.PAUSED:
        hint = "use recover_tool_loop" if status == RunStatus.RUNNING else "it ended"
        raise CheckpointConflict(f"run {run_id!r} exists and is {status}, not paused ({hint})")
    if approve is None:
        return engine._result(lp, RunStatus.PAUSED)
    if isinstance(approve, bool):
        lp.decisions = {p.call_id: Decision(approve, note) for p in lp.pending}
    else:
        lp.decisions = {p.call_id: Decision(bool(approve[p.call_id]), note) for p in lp.pending if p.call_id in approve}
        if len(lp.decisions) != len(lp.pending):
            raise ValueError(f"run {run_id!r}: decide every pending call ({[p.call_id for p in lp.pending]})")
    lp.pending = []
    seeds = await _seeds(engine, lp, body, rerun_in_doubt=False)
    assert lp.step is not None
    await engine.save(lp, RunStatus.RUNNING, segment=lp.step + 1)
    return await engine.drive(lp, seeds)


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
    seeds = await _seeds(engine, lp, body, rerun_in_doubt)
    assert lp.step is not None
    await engine.save(lp, RunStatus.RUNNING, segment=lp.step + 1)
    return await engine.drive(lp, seeds)
