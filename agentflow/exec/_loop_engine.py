"""The tool loop's engine: the loop cursor, its checkpoints, and the model/tools cycle.

See `_durable_loop` for the public functions and the storage layout.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentflow._errors import (
    ApprovalDenied,
    CheckpointConflict,
    CheckpointError,
    CheckpointStoreCorrupt,
    ModelError,
    ToolArgumentsInvalid,
    UnknownTool,
)
from agentflow._events import Events
from agentflow._identity import RunContext, restore_identity
from agentflow._run_types import RunStatus
from agentflow.exec._durable import (
    CallLog,
    Decision,
    Journal,
    PauseForApproval,
    describe_failure,
    envelope,
    read_decisions,
    read_pending,
)
from agentflow.exec._durable_read import CallState
from agentflow.exec._durable_seal import Sealer, canonical
from agentflow.exec._executor import ApprovalRequest, Executor
from agentflow.exec.checkpoints._protocol import CheckpointStore
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
class LoopCursor:
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


class LoopEngine:
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

    def _body(self, lp: LoopCursor, recovered: dict[str, Any] | None) -> dict[str, Any]:
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
            **envelope(lp.identity, lp.pending, lp.decisions, lp.journal, lp.error),
        }
        if recovered is not None:
            body["recovered"] = recovered
        return body

    async def save(
        self,
        lp: LoopCursor,
        status: str,
        *,
        segment: int | None = None,
        claim: str | None = None,
        recovered: dict[str, Any] | None = None,
    ) -> None:
        if self.store is None or self.sealer is None:
            return
        step = 0 if lp.step is None else lp.step + 1
        if segment is not None:
            lp.journal = Journal(self.store, self.sealer, lp.run_id, segment)
        assert lp.journal is not None
        body = self._body(lp, recovered)
        if claim is not None:
            body["claim"] = claim
        row = self.sealer.seal_checkpoint(lp.run_id, step, lp.flow, status, lp.journal.segment, time.time(), body)
        await lp.journal.save(step, row)
        lp.step, lp.chain, lp.saved_len = step, body["history"]["chain"], len(lp.history)
        self.events.emit(
            "checkpoint.saved", lp.run_id, kind="loop", step=step, status=status, stage=lp.stage, unreplayed=[]
        )

    async def load(self, run_id: str, flow: str, ctx: RunContext | None) -> tuple[LoopCursor, str, dict[str, Any]]:
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
        lp = LoopCursor(
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
            decisions=read_decisions(body),
            pending=read_pending(body, restored),
            error=body.get("error"),
        )
        return lp, last.status, body

    # -- the loop -------------------------------------------------------------------

    async def drive(
        self,
        lp: LoopCursor,
        seeds: Mapping[str, CallState] | None = None,
        *,
        limit: int | None = None,
        recovering: bool | None = None,
    ) -> LoopResult:
        """Run stages (a model call, or a round of tools) until the loop ends, pauses, or `limit` ran."""
        recovering = seeds is not None if recovering is None else recovering
        replayed: list[str] = []
        rerun: list[str] = []
        stages = 0
        while True:
            if limit is not None and stages >= limit:
                return self._result(lp, RunStatus.RUNNING, replayed, rerun)
            stages += 1
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

    async def _ask_model(self, lp: LoopCursor) -> Message:
        if lp.journal is not None:
            marker = {"call_id": f"{lp.turn + 1}/model", "superstep": lp.turn + 1, "model": True}
            await lp.journal.write("started", marker)
        lp.model_calls += 1
        reply = await self.model.complete(list(lp.history), self.executor.registry.schemas())
        if not isinstance(reply, Message) or reply.role != "assistant":
            raise ModelError(f"the model returned {reply!r}, not an assistant Message")
        lp.turn += 1
        return reply

    async def _run_tools(self, lp: LoopCursor, log: CallLog) -> list[Message] | None:
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
        lp: LoopCursor, status: RunStatus, replayed: list[str] | None = None, rerun: list[str] | None = None
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
