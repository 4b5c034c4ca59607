"""Tool loops in the run protocol: the loop's cursor, its checkpoint body, and the model/tools cycle.

`LoopDriver` is what a tool loop plugs into `agentflow.exec.run.protocol.RunProtocol`; the
protocol owns the durable sequence. See `_loop_functions` for the storage layout (each
checkpoint stores only the messages added since the previous one).
A model call takes a slot of the registry's limit named after the model's provider (its
``provider`` attribute, else its adapter: ``openai``, ``anthropic``) through the executor's
gate, as tool calls do; it waits for one while the run's lease is renewed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from agentflow._errors import (
    ApprovalDenied,
    CheckpointError,
    CheckpointStoreCorrupt,
    FlowError,
    ModelError,
    ToolArgumentsInvalid,
    UnknownTool,
)
from agentflow._identity import RunContext
from agentflow._run_types import RunKind, RunStatus
from agentflow.exec._executor import Executor
from agentflow.exec.calls.log import CallLog, PauseForApproval, describe_failure
from agentflow.exec.calls.read import CallState, LoggedRecord, analyze
from agentflow.exec.checkpoints import CheckpointStore, SealedCheckpoint
from agentflow.exec.limits.table import provider_of
from agentflow.exec.run.cancel import CancelRequested
from agentflow.exec.run.cursor import RunCursor, RunOutcome
from agentflow.exec.run.driver import RunDriver
from agentflow.exec.run.protocol import RunProtocol
from agentflow.exec.run.steps import RunSteps
from agentflow.exec.seal import Sealer, canonical
from agentflow.models import Message, Model, ToolCall

_EMPTY_CHAIN = hashlib.sha256(b"agentflow/history/1").hexdigest()


def chain(prev: str, message: Message) -> str:
    """Extend the history digest chain by one message."""
    return hashlib.sha256(prev.encode() + canonical(message.model_dump(mode="json"))).hexdigest()


@dataclass
class LoopResult(RunOutcome):
    """The outcome of an operation on a tool loop (`LoopRunner`, `run_tool_loop`, `recover_tool_loop`)."""

    messages: list[Message]
    """The whole conversation, initial messages included."""
    model_calls: int
    """Model calls made over the whole run."""

    @property
    def text(self) -> str:
        """The content of the last assistant message ("" if there is none)."""
        return answer_of(self.messages)


def answer_of(messages: Sequence[Message]) -> str:
    """The content of the last assistant message of a conversation ("" if there is none)."""
    for message in reversed(messages):
        if message.role == "assistant":
            return message.content
    return ""


@dataclass
class LoopCursor(RunCursor):
    """One worker's hold on a tool loop between stages."""

    history: list[Message]
    """The whole conversation so far."""
    max_steps: int
    """The most model calls the run may make."""
    stage: str = "start"
    """``start``, ``model`` (a reply is waiting for its tools) or ``tools``."""
    turn: int = 0
    """Model replies so far (the loop's superstep)."""
    model_calls: int = 0
    """Model calls made, recoveries included."""
    chain: str = _EMPTY_CHAIN
    """The digest chain over the history saved so far."""
    saved_len: int = 0
    """How many messages are saved already."""


LoopProtocol = RunProtocol[LoopCursor, LoopResult]


class LoopDriver(RunDriver[LoopCursor, LoopResult]):
    """A tool loop, as the run protocol drives it."""

    kind: ClassVar[RunKind] = RunKind.LOOP
    noun: ClassVar[str] = "tool loop"
    id_prefix: ClassVar[str] = "loop-"
    refused: ClassVar[Mapping[str, str]] = {
        "retry": "a loop fails only when it reached max_steps, which a retry would reach again; start a new loop "
        "from its history (read it with LoopRunner.read)",
        "migrate": "tool loops have no versions to migrate between",
    }

    def __init__(self, model: Model, executor: Executor, name: str) -> None:
        self.model = model
        self.executor = executor
        self.events = executor.events
        self.name = name
        self._loaded: tuple[str, list[Message]] | None = None

    @property
    def column(self) -> str:
        """``loop:<name>``."""
        return RunKind.LOOP.column(self.name)

    # -- the checkpoint body ----------------------------------------------------------

    async def read(
        self, store: CheckpointStore, sealer: Sealer, run_id: str, row: SealedCheckpoint | None
    ) -> tuple[SealedCheckpoint, dict[str, Any]]:
        """Read the loop's checkpoints up to `row` (its messages are spread over them) and check the chain.

        A row read already is not enough here: the history is rebuilt from every row up to it
        (the latest, without `row`; an earlier one for a fork).
        """
        rows = list(await store.history(run_id))
        if not rows:
            await store.latest(run_id)  # raises CheckpointNotFound with the store's message
        if row is not None:
            rows = [each for each in rows if each.step <= row.step]
        history: list[Message] = []
        digest = _EMPTY_CHAIN
        body: dict[str, Any] = {}
        for expected, each in enumerate(rows):
            body = sealer.open_checkpoint(each, run_id)
            if each.step != expected:
                raise CheckpointStoreCorrupt(f"run {run_id!r}: checkpoint {expected} is missing from its history")
            self.owns(run_id, each, body)
            for raw in body["new"]:
                message = Message.model_validate(raw)
                history.append(message)
                digest = chain(digest, message)
        if body["history"] != {"len": len(history), "chain": digest}:
            raise CheckpointStoreCorrupt(f"run {run_id!r}: the stored history does not match its digest chain")
        self._loaded = (run_id, history)  # for `cursor`, which the protocol calls next
        return rows[-1], body

    def cursor(self, row: SealedCheckpoint, body: dict[str, Any], ctx: RunContext | None) -> LoopCursor:
        """Rebuild a cursor from the checked checkpoint and the history `read` rebuilt."""
        assert self._loaded is not None and self._loaded[0] == row.run_id
        history = self._loaded[1]
        return LoopCursor(
            row.run_id,
            dict(body["identity"]),
            ctx,
            history,
            int(body["max_steps"]),
            stage=str(body["stage"]),
            turn=int(body["turn"]),
            model_calls=int(body["model_calls"]),
            chain=str(body["history"]["chain"]),
            saved_len=len(history),
        )

    def forked(
        self, source: LoopCursor, run_id: str, identity: dict[str, Any], ctx: RunContext | None, patch: Any
    ) -> LoopCursor:
        """A new loop from `source`: its messages, stage, turn and model calls (its step budget as spent then).

        Raises:
            FlowError: a patch was given (a loop's fork starts from the checkpoint's messages as they are).
        """
        if patch is not None:
            raise FlowError(
                f"a tool loop's fork starts from the checkpoint's messages as they are: fork {source.run_id!r} "
                "without a patch (a patch changes a flow run's state)"
            )
        return LoopCursor(
            run_id,
            identity,
            ctx,
            list(source.history),
            source.max_steps,
            stage=source.stage,
            turn=source.turn,
            model_calls=source.model_calls,
        )

    def typed(self, messages: list[Any], output: Any) -> tuple[list[Any], Any]:
        """The stored messages as `Message`s, and the loop's output: the text of its last answer."""
        history = [Message.model_validate(raw) for raw in messages]
        return history, answer_of(history)

    def fields(self, cur: LoopCursor) -> dict[str, Any]:
        """Stage, turn, counts, and the messages added since the last checkpoint with the chain."""
        new = cur.history[cur.saved_len :]
        digest = cur.chain
        for message in new:
            digest = chain(digest, message)
        return {
            "stage": cur.stage,
            "turn": cur.turn,
            "model_calls": cur.model_calls,
            "max_steps": cur.max_steps,
            "new": [m.model_dump(mode="json") for m in new],
            "history": {"len": len(cur.history), "chain": digest},
        }

    def after_save(self, cur: LoopCursor, body: Mapping[str, Any]) -> None:
        """The saved messages are now part of the chain."""
        cur.chain, cur.saved_len = body["history"]["chain"], len(cur.history)

    def event_fields(self, cur: LoopCursor) -> dict[str, Any]:
        """The loop's name and stage."""
        return {"loop": self.name, "stage": cur.stage}

    def superstep(self, cur: LoopCursor) -> int:
        """The loop's turn."""
        return cur.turn

    def seeds(self, cur: LoopCursor, records: Sequence[LoggedRecord]) -> dict[str, CallState]:
        """Model calls are counted from their markers (one cut off by a crash counts); tool calls as flows'."""
        cur.model_calls = max(cur.model_calls, sum(1 for r in records if r.body.get("model")))
        return analyze(records, cur.turn) if cur.stage == "model" else {}

    def result(
        self, cur: LoopCursor, status: RunStatus, replayed: list[str] | None = None, rerun: list[str] | None = None
    ) -> LoopResult:
        """The loop as it stands."""
        return LoopResult(cur.run_id, status, list(cur.history), cur.model_calls, **cur.outcome(replayed, rerun))

    # -- the loop -------------------------------------------------------------------

    async def drive(
        self,
        proto: RunSteps[LoopCursor, LoopResult],
        lp: LoopCursor,
        seeds: Mapping[str, CallState],
        *,
        limit: int | None,
        recovering: bool,
    ) -> LoopResult:
        """Run stages (a model call, or a round of tools) until the loop ends, pauses, or `limit` ran.

        Each stage runs in a span of its own (`RunSteps.step_span`).
        """
        replayed: list[str] = []
        rerun: list[str] = []
        stages = 0
        while True:
            if limit is not None and stages >= limit:
                return self.result(lp, RunStatus.RUNNING, replayed, rerun)
            stages += 1
            if stages == 1 and lp.watch is not None:  # a boundary: a cancel request stops the loop before it starts
                await lp.watch.check(boundary=True)
            with proto.step_span(lp):
                ended = await self._stage(proto, lp, seeds, recovering, replayed, rerun)
            if ended is not None:
                return ended
            seeds, recovering = {}, False

    async def _stage(
        self,
        proto: RunSteps[LoopCursor, LoopResult],
        lp: LoopCursor,
        seeds: Mapping[str, CallState],
        recovering: bool,
        replayed: list[str],
        rerun: list[str],
    ) -> LoopResult | None:
        """Run one stage and save its checkpoint; the result if the loop ended or paused, else None."""
        if lp.stage in ("start", "tools"):
            if lp.model_calls >= lp.max_steps:
                lp.error = f"max_steps ({lp.max_steps}) reached: the model was called {lp.model_calls} times"
                finished = proto.ending_event(
                    "run.finished", lp.run_id, loop=self.name, status="failed", error=lp.error
                )
                await proto.save(lp, RunStatus.FAILED, ending=finished)
                return self.result(lp, RunStatus.FAILED, replayed, rerun)
            reply = await self._ask_model(lp)
            await self._stage_ended(lp)
            lp.history.append(reply)
            lp.stage = "model"
            status = RunStatus.RUNNING if reply.tool_calls else RunStatus.DONE
            done = status is RunStatus.DONE
            finished = (
                proto.ending_event("run.finished", lp.run_id, loop=self.name, status=status.value) if done else None
            )
            await proto.save(lp, status, ending=finished)
            return self.result(lp, status, replayed, rerun) if status is RunStatus.DONE else None
        if not lp.history[-1].tool_calls:  # the model answered already (a fork of a loop that ended): it ends there
            finished = proto.ending_event("run.finished", lp.run_id, loop=self.name, status=RunStatus.DONE.value)
            await proto.save(lp, RunStatus.DONE, ending=finished)
            return self.result(lp, RunStatus.DONE, replayed, rerun)
        log = lp.call_log(self.executor, lp.turn, seeds)
        results = await self._run_tools(lp, log)
        await self._stage_ended(lp)
        replayed += log.replayed
        rerun += log.rerun
        recovered = proto.report_step(lp, log.replayed, log.rerun, recovering)
        if results is None:
            lp.pending = list(log.pending)
            await proto.save(lp, RunStatus.PAUSED, recovered=recovered)
            return self.result(lp, RunStatus.PAUSED, replayed, rerun)
        messages, wake_at = results
        lp.history.extend(messages)
        lp.stage, lp.decisions, lp.pending = "tools", {}, []
        if wake_at is not None and wake_at > time.time():  # a waiting tool: nothing is held until then
            lp.wake = {"at": wake_at, "for": "timer"}
            await proto.save(lp, RunStatus.PAUSED, recovered=recovered)
            self.events.emit("run.waiting", lp.run_id, until=wake_at)
            return self.result(lp, RunStatus.PAUSED, replayed, rerun)
        await proto.save(lp, RunStatus.RUNNING, recovered=recovered)
        return None

    @staticmethod
    async def _stage_ended(lp: LoopCursor) -> None:
        """Stop at a stage's end if a cancel request came: nothing of the stage is kept (`CancelRequested`)."""
        if lp.watch is not None:
            await lp.watch.step_ended()

    async def _ask_model(self, lp: LoopCursor) -> Message:
        with self.executor.tracer.model_call(lp.run_id, self.model, lp.turn + 1) as span:
            if lp.journal is not None:
                marker = {"call_id": f"{lp.turn + 1}/model", "superstep": lp.turn + 1, "model": True}
                if lp.span.ref is not None:  # the stage's span: a recovery links to it
                    marker["span"] = lp.span.ref
                await lp.journal.write("started", marker)
            lp.model_calls += 1
            reply = await self.executor.gate.run(
                self.executor.registry.limits.of_model(self.model),
                {},
                lp.ctx,
                {"run_id": lp.run_id, "model": provider_of(self.model), "call_id": f"{lp.turn + 1}/model"},
                functools.partial(self.model.complete, list(lp.history), self.executor.registry.schemas()),
            )
            if not isinstance(reply, Message) or reply.role != "assistant":
                raise ModelError(f"the model returned {reply!r}, not an assistant Message")
            span.reply(reply)
        lp.turn += 1
        return reply

    async def _run_tools(self, lp: LoopCursor, log: CallLog) -> tuple[list[Message], float | None] | None:
        """The round's tool messages and, if a waiting tool ran, the latest time it said to wake at (None: paused)."""
        reply = lp.history[-1]
        out: list[Message] = []
        wakes: list[float] = []
        # The reply's calls run one after another and only their tool messages follow the last.
        log.closes_with("tools", len(reply.tool_calls))
        for index, call in enumerate(reply.tool_calls):
            out.append(Message.tool(call, await self._one_tool(log, index, call, wakes)))
        return None if log.pending else (out, max(wakes, default=None))

    async def _one_tool(self, log: CallLog, index: int, call: ToolCall, wakes: list[float]) -> str:
        try:
            value = await log.call("tools", index, call.name, call.arguments)
        except PauseForApproval:
            return ""
        except CancelRequested:
            raise  # the protocol ends the loop; the calls before this one are logged
        except ApprovalDenied as exc:
            return f"denied: {exc}"
        except CheckpointError:
            raise
        except (UnknownTool, ToolArgumentsInvalid) as exc:  # refused before logging: the model can correct it
            return f"error: {exc}"
        except Exception as exc:  # the same text live and when replayed after a crash
            return f"error: {describe_failure(exc)}"
        tool = self.executor.registry.get(call.name)
        if tool.waits and isinstance(value, datetime) and value.tzinfo is not None:
            wakes.append(value.timestamp())
        elif tool.waits:
            return f"error: {call.name} returned {value!r}, not an aware datetime: the loop does not wait"
        if isinstance(value, str):
            return value
        return json.dumps(tool.encode_result(value), sort_keys=True)
