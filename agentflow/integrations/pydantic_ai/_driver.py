"""`AgentDriver`: a pydantic-ai agent's run, as the run protocol drives it (see README.md).

A run alternates two stages, each ending with a checkpoint, as a tool loop does:
- ``start``/``tools`` → ``model``: pydantic-ai resumes from the saved history (or the
  prompt) and makes one model request; the stage ends once the response is in. A
  ``started`` marker before the request counts it (`max_requests` holds across crashes).
- ``model`` → ``tools`` or done: pydantic-ai resumes from the saved history, which ends
  with the response, and handles it: its tool calls go through the call log (`_tools`),
  or its output is validated and the run ends. A retry prompt or the tool results are the
  next request, saved for the next stage.
A stage that starts a drive (a worker's superstep, a recovery, a resume) runs `Agent.iter`
afresh from the history its checkpoint holds; the stages after it in the same drive go on
with the same pydantic-ai run (`_Live`), which is where a fresh one would have started from:
its history is the saved one, and what pydantic-ai counts across a run that the history does
not show is counted from the history (a tool's retries, `_tools.retries_used`). So a stage is
the same whether it follows the previous one in this process or in another after a crash,
and an in-process run pays pydantic-ai's run set-up once, not at every stage.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import TypeAdapter
from pydantic_ai import Agent
from pydantic_ai.agent import AbstractAgent, AgentRun
from pydantic_ai.exceptions import ModelAPIError
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.usage import RunUsage, UsageLimits
from pydantic_core import to_jsonable_python

from agentflow._errors import (
    CheckpointError,
    CheckpointStoreCorrupt,
    FlowError,
    ModelError,
)
from agentflow._identity import RunContext
from agentflow._run_types import RunKind, RunStatus
from agentflow.exec import Executor
from agentflow.exec.calls.log import CallLog, PauseForApproval
from agentflow.exec.calls.read import CallState, LoggedRecord, analyze
from agentflow.exec.checkpoints import CheckpointStore, SealedCheckpoint
from agentflow.exec.run.cancel import CancelRequested
from agentflow.exec.run.cursor import RunCursor, RunOutcome
from agentflow.exec.run.driver import RunDriver
from agentflow.exec.run.steps import RunSteps
from agentflow.exec.seal import Sealer, canonical
from agentflow.integrations.pydantic_ai._deps import AgentInput, build
from agentflow.integrations.pydantic_ai._tools import AgentTools, Durability, Stage

__all__ = ["ENGINE", "AgentCursor", "AgentDriver", "AgentInput", "AgentResult"]

#: What an agent run's checkpoints say drives it (a tool loop's say nothing).
ENGINE = "pydantic-ai"
_EMPTY_CHAIN = hashlib.sha256(b"agentflow/pydantic-ai/history/1").hexdigest()
_USAGE = TypeAdapter(RunUsage)
#: Errors that are not the agent's (as a flow's driver has them): the store refused or failed, the run
#: is being cancelled, or a call waits for a person. The run stays as saved; every other error fails it.
_NOT_THE_AGENTS = (CheckpointError, CancelRequested, PauseForApproval)


def _chain(prev: str, raw: Mapping[str, Any]) -> str:
    return hashlib.sha256(prev.encode() + canonical(raw)).hexdigest()


def _dump(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    dumped: list[dict[str, Any]] = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    return dumped


@dataclass
class AgentResult(RunOutcome):
    """A durable agent's run as it stands (`AgentRunner.run`, `read`, `recover`...)."""

    messages: list[ModelMessage]
    """The whole conversation (pydantic-ai's messages)."""
    model_calls: int
    """Model requests made over the whole run, recoveries included."""
    usage: RunUsage = field(default_factory=RunUsage)
    """pydantic-ai's usage over the run (a request cut off by a crash is not in it)."""
    output: Any = None
    """The agent's output once the run is done (of the agent's output type where it can be rebuilt)."""


@dataclass
class AgentCursor(RunCursor):
    """One worker's hold on an agent run between stages."""

    prompt: str | None
    """The user prompt (sent by the first model stage)."""
    deps_data: dict[str, Any]
    """The JSON the `deps` factory gets."""
    max_steps: int
    """The most model requests the run may make."""
    history: list[ModelMessage] = field(default_factory=list)
    stage: str = "start"
    """``start``, ``model`` (a response waits to be handled) or ``tools`` (a request waits for the model)."""
    turn: int = 0
    """Model responses so far (the run's superstep)."""
    model_calls: int = 0
    usage: RunUsage = field(default_factory=RunUsage)
    output: Any = None
    """The output's JSON form once done."""
    saved: list[dict[str, Any]] = field(default_factory=list)
    """The JSON of each message saved so far."""
    chains: list[str] = field(default_factory=list)
    """The digest chain after each saved message."""
    _next: tuple[list[dict[str, Any]], list[str]] | None = None


@dataclass
class _Live:
    """The pydantic-ai run a drive goes on with from one stage to the next, and where it stands."""

    run: AgentRun[Any, Any]
    node: Any
    """The node the next stage starts from: the one that handles a response, or that makes the next request."""
    stage: Stage
    """The stage object the run's toolset holds (its log is set per stage)."""


class AgentDriver(RunDriver[AgentCursor, AgentResult]):
    """A pydantic-ai agent's run, as the run protocol drives it."""

    kind: ClassVar[RunKind] = RunKind.LOOP
    engine: ClassVar[str | None] = ENGINE
    noun: ClassVar[str] = "pydantic-ai agent"
    id_prefix: ClassVar[str] = "agent-"
    refused: ClassVar[Mapping[str, str]] = {"migrate": "agent runs have no versions to migrate between"}

    def __init__(
        self,
        agent: AbstractAgent[Any, Any],
        tools: AgentTools,
        executor: Executor,
        name: str,
        *,
        deps: Callable[[AgentInput], Any] | None,
        usage_limits: UsageLimits | None,
        stream: bool = False,
    ) -> None:
        self.agent, self.tools, self.executor, self.name = agent, tools, executor, name
        self.stream = stream
        self.events = executor.events
        self.deps, self.usage_limits = deps, usage_limits
        self._loaded: tuple[str, AgentCursor] | None = None
        output_type = getattr(agent, "output_type", None)
        try:
            self._output: TypeAdapter[Any] | None = TypeAdapter(output_type) if output_type is not None else None
        except Exception:  # an output spec that is not a type (a function, a list of tools): kept as JSON
            self._output = None

    @property
    def column(self) -> str:
        """``loop:<name>``."""
        return RunKind.LOOP.column(self.name)

    # -- the checkpoint body ----------------------------------------------------------

    async def read(
        self, store: CheckpointStore, sealer: Sealer, run_id: str, row: SealedCheckpoint | None
    ) -> tuple[SealedCheckpoint, dict[str, Any]]:
        """Read the run's checkpoints up to `row` (the latest without it) and check the chain of its messages."""
        rows = list(await store.history(run_id))
        if not rows:
            await store.latest(run_id)  # raises CheckpointNotFound with the store's message
        if row is not None:
            rows = [each for each in rows if each.step <= row.step]
        saved: list[dict[str, Any]] = []
        chains: list[str] = []
        body: dict[str, Any] = {}
        first: dict[str, Any] = {}
        for expected, each in enumerate(rows):
            body = sealer.open_checkpoint(each, run_id)
            if each.step != expected:
                raise CheckpointStoreCorrupt(f"run {run_id!r}: checkpoint {expected} is missing from its history")
            self.owns(run_id, each, body)
            first = first or body
            keep = body.get("keep")
            if not isinstance(keep, int) or not 0 <= keep <= len(saved):
                raise CheckpointStoreCorrupt(f"run {run_id!r}: checkpoint {each.step} keeps {keep!r} messages")
            del saved[keep:], chains[keep:]
            for raw in body["new"]:
                chains.append(_chain(chains[-1] if chains else _EMPTY_CHAIN, raw))
                saved.append(raw)
        if body["history"] != {"len": len(saved), "chain": chains[-1] if chains else _EMPTY_CHAIN}:
            raise CheckpointStoreCorrupt(f"run {run_id!r}: the stored history does not match its digest chain")
        try:
            history = ModelMessagesTypeAdapter.validate_python(saved)
            usage = _USAGE.validate_python(body.get("usage") or {})
        except ValueError as exc:
            raise CheckpointStoreCorrupt(f"run {run_id!r} is signed but its messages do not load: {exc}") from None
        cur = AgentCursor(
            run_id,
            dict(body["identity"]),
            None,
            first.get("prompt"),
            dict(first.get("deps_data") or {}),
            int(body["max_steps"]),
            history=history,
            stage=str(body["stage"]),
            turn=int(body["turn"]),
            model_calls=int(body["model_calls"]),
            usage=usage,
            output=body.get("output"),
            saved=saved,
            chains=chains,
        )
        self._loaded = (run_id, cur)  # for `cursor`, which the protocol calls next
        return rows[-1], body

    def cursor(self, row: SealedCheckpoint, body: dict[str, Any], ctx: RunContext | None) -> AgentCursor:
        """The cursor `read` rebuilt from every checkpoint."""
        assert self._loaded is not None and self._loaded[0] == row.run_id
        cur = self._loaded[1]
        cur.ctx = ctx
        return cur

    def forked(
        self, source: AgentCursor, run_id: str, identity: dict[str, Any], ctx: RunContext | None, patch: Any
    ) -> AgentCursor:
        """A new run from `source`: its prompt, `deps_data`, messages, stage and usage (its budget as spent then).

        Raises:
            FlowError: a patch was given (an agent run's fork starts from the checkpoint's messages as they are).
        """
        if patch is not None:
            raise FlowError(
                f"an agent run's fork starts from the checkpoint's messages as they are: fork {source.run_id!r} "
                "without a patch (a patch changes a flow run's state)"
            )
        return AgentCursor(
            run_id,
            identity,
            ctx,
            source.prompt,
            dict(source.deps_data),
            source.max_steps,
            history=list(source.history),
            stage=source.stage,
            turn=source.turn,
            model_calls=source.model_calls,
            usage=copy.deepcopy(source.usage),
        )

    def typed(self, messages: list[Any], output: Any) -> tuple[list[Any], Any]:
        """The stored messages as pydantic-ai's, and the output as the agent's output type (where it rebuilds)."""
        return ModelMessagesTypeAdapter.validate_python(messages), self._revive(output)

    def fields(self, cur: AgentCursor) -> dict[str, Any]:
        """Stage, counts, usage, and the messages changed since the last checkpoint with the chain."""
        raws = _dump(cur.history)
        keep, most = 0, min(len(cur.saved), len(raws))
        while keep < most and cur.saved[keep] == raws[keep]:  # pydantic-ai may rewrite the tail it resumed from
            keep += 1
        chains = cur.chains[:keep]
        for raw in raws[keep:]:
            chains.append(_chain(chains[-1] if chains else _EMPTY_CHAIN, raw))
        cur._next = (raws, chains)
        body: dict[str, Any] = {
            "engine": self.engine,
            "stage": cur.stage,
            "turn": cur.turn,
            "model_calls": cur.model_calls,
            "max_steps": cur.max_steps,
            "usage": _USAGE.dump_python(cur.usage, mode="json"),
            "keep": keep,
            "new": raws[keep:],
            "history": {"len": len(raws), "chain": chains[-1] if chains else _EMPTY_CHAIN},
        }
        if cur.step is None:  # step 0: what the run was started with
            body["prompt"], body["deps_data"] = cur.prompt, cur.deps_data
        if cur.output is not None:
            body["output"] = cur.output
        return body

    def after_save(self, cur: AgentCursor, body: Mapping[str, Any]) -> None:
        """The saved messages are now the history the next checkpoint is told against."""
        if cur._next is not None:
            cur.saved, cur.chains = cur._next
            cur._next = None

    def event_fields(self, cur: AgentCursor) -> dict[str, Any]:
        """The agent's name (as a loop's) and the stage."""
        return {"loop": self.name, "stage": cur.stage}

    def superstep(self, cur: AgentCursor) -> int:
        """The run's turn."""
        return cur.turn

    def seeds(self, cur: AgentCursor, records: Sequence[LoggedRecord]) -> dict[str, CallState]:
        """Model requests are counted from their markers (one cut off counts); tool calls as a loop's."""
        cur.model_calls = max(cur.model_calls, sum(1 for r in records if r.body.get("model")))
        return analyze(records, cur.turn) if cur.stage == "model" else {}

    def result(
        self,
        cur: AgentCursor,
        status: RunStatus,
        replayed: list[str] | None = None,
        rerun: list[str] | None = None,
    ) -> AgentResult:
        """The run as it stands."""
        return AgentResult(
            cur.run_id,
            status,
            list(cur.history),
            cur.model_calls,
            cur.usage,
            self._revive(cur.output),
            **cur.outcome(replayed, rerun),
        )

    def _revive(self, stored: Any) -> Any:
        if stored is None or self._output is None:
            return stored
        try:
            return self._output.validate_python(stored)
        except ValueError:
            return stored

    # -- the stages -------------------------------------------------------------------

    async def drive(
        self,
        proto: RunSteps[AgentCursor, AgentResult],
        cur: AgentCursor,
        seeds: Mapping[str, CallState],
        *,
        limit: int | None,
        recovering: bool,
    ) -> AgentResult:
        """Run stages until the run ends, pauses, or `limit` ran (each in a span of its own)."""
        replayed: list[str] = []
        rerun: list[str] = []
        stages = 0
        async with AsyncExitStack() as runs:  # the pydantic-ai run the stages go on with, closed at the end
            live: _Live | None = None
            while True:
                if limit is not None and stages >= limit:
                    return self.result(cur, RunStatus.RUNNING, replayed, rerun)
                stages += 1
                if stages == 1 and cur.watch is not None:  # a boundary: a cancel request stops the run first
                    await cur.watch.check(boundary=True)
                with proto.step_span(cur):
                    if cur.stage in ("start", "tools"):
                        ended, live = await self._model_stage(proto, cur, runs, live)
                    else:
                        ended, live = await self._tools_stage(
                            proto, cur, runs, live, seeds, recovering, replayed, rerun
                        )
                if ended is not None:
                    return self.result(cur, ended, replayed, rerun)
                seeds, recovering = {}, False

    async def _live(self, cur: AgentCursor, runs: AsyncExitStack, live: _Live | None, log: CallLog | None) -> _Live:
        """The run to go on with (`live`), or a fresh one from the saved history; its stage set to `log`'s."""
        if live is None:
            stage = Stage(self.tools)
            run = await runs.enter_async_context(self._iter(cur, stage, cur.prompt if cur.stage == "start" else None))
            live = _Live(run, run.next_node, stage)
        live.stage.log, live.stage.broken = log, False
        return live

    def _iter(
        self, cur: AgentCursor, stage: Stage, prompt: str | None
    ) -> AbstractAsyncContextManager[AgentRun[Any, Any]]:
        deps = build(self.agent, self.name, self.deps, AgentInput(cur.run_id, cur.deps_data))
        return self.agent.iter(
            prompt,
            message_history=list(cur.history),
            conversation_id=cur.run_id,  # each drive is a pydantic-ai run of its own, all in one conversation
            deps=deps,
            usage=copy.deepcopy(cur.usage),
            usage_limits=self.usage_limits,
            capabilities=[Durability(stage)],
            infer_name=False,
        )

    async def _model_stage(
        self, proto: RunSteps[AgentCursor, AgentResult], cur: AgentCursor, runs: AsyncExitStack, live: _Live | None
    ) -> tuple[RunStatus | None, _Live | None]:
        """Make the next model request; save the history with its response (the run's next turn)."""
        if cur.model_calls >= cur.max_steps:
            why = f"max_requests ({cur.max_steps}) reached: {cur.model_calls} requests made"
            return await self._fail(proto, cur, why), None
        if cur.journal is not None:
            marker: dict[str, Any] = {"call_id": f"{cur.turn + 1}/model", "superstep": cur.turn + 1, "model": True}
            if cur.span.ref is not None:  # the stage's span: a recovery links to it
                marker["span"] = cur.span.ref
            await cur.journal.write("started", marker)
        cur.model_calls += 1
        try:
            live = await self._live(cur, runs, live, None)
            live.node = await self._request(cur, live.run, live.node)
            messages, usage = list(live.run.all_messages()), copy.deepcopy(live.run.usage)
        except _NOT_THE_AGENTS:
            raise
        except ModelAPIError as exc:  # the provider failed: the run stays where it was (a recovery asks again,
            # each request counted, so max_requests ends a provider that keeps failing)
            raise ModelError(f"agent {self.name!r}: the model request failed: {exc}") from exc
        except Exception as exc:
            return await self._fail(proto, cur, f"{type(exc).__name__}: {exc}"), None
        if cur.watch is not None:
            await cur.watch.step_ended()
        cur.history, cur.usage = messages, usage
        cur.stage, cur.turn = "model", cur.turn + 1
        await proto.save(cur, RunStatus.RUNNING)
        return None, live

    async def _request(self, cur: AgentCursor, run: AgentRun[Any, Any], node: Any) -> Any:
        """Drive pydantic-ai's graph from `node` through one model request; the node that handles its response."""
        requested = False
        while not (requested and Agent.is_call_tools_node(node)):  # until the response is in
            if Agent.is_end_node(node) or (Agent.is_call_tools_node(node) and not requested):
                raise ModelError(f"agent {self.name!r} did not ask its model from stage {cur.stage!r}")
            if Agent.is_model_request_node(node):
                requested = True
                if self.stream:
                    await self._stream(cur, node, run)
            node = await run.next(node)
        return node

    async def _stream(self, cur: AgentCursor, node: Any, run: AgentRun[Any, Any]) -> None:
        """Make the request streamed, reporting the model's text as it comes (``model.text``)."""
        async with node.stream(run.ctx) as response:
            async for event in response:
                text = None
                if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                    text = event.part.content
                elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                    text = event.delta.content_delta
                if text:
                    self.events.emit("model.text", cur.run_id, loop=self.name, turn=cur.turn + 1, text=text)

    async def _tools_stage(
        self,
        proto: RunSteps[AgentCursor, AgentResult],
        cur: AgentCursor,
        runs: AsyncExitStack,
        live: _Live | None,
        seeds: Mapping[str, CallState],
        recovering: bool,
        replayed: list[str],
        rerun: list[str],
    ) -> tuple[RunStatus | None, _Live | None]:
        """Let pydantic-ai handle the saved response: its tool calls (logged), or the output."""
        log = cur.call_log(self.executor, cur.turn, seeds)
        failure: str | None = None
        output: Any = None
        ended = False
        try:
            live = await self._live(cur, runs, live, log)
            run, node = live.run, live.node
            while True:
                node = await run.next(node)
                if Agent.is_end_node(node):
                    ended, output = True, to_jsonable_python(node.data.output)
                    break
                if Agent.is_model_request_node(node):  # handled: the next request waits for the model
                    break
            live.node = node
            messages, usage = list(run.all_messages()), copy.deepcopy(run.usage)
            if not ended:  # the request pydantic-ai resumes from (tool results, a retry prompt)
                messages.append(node.request)
        except PauseForApproval:
            messages, usage = cur.history, cur.usage
        except _NOT_THE_AGENTS:
            raise
        except Exception as exc:  # the agent's own failure (a tool's error, a limit, an output it gave up on)
            failure = f"{type(exc).__name__}: {exc}"
            messages, usage = cur.history, cur.usage
        if cur.watch is not None:
            await cur.watch.step_ended()
        replayed += log.replayed
        rerun += log.rerun
        recovered = proto.report_step(cur, log.replayed, log.rerun, recovering)
        if failure is not None:
            return await self._fail(proto, cur, failure, recovered), None
        if log.pending:
            cur.pending = list(log.pending)
            await proto.save(cur, RunStatus.PAUSED, recovered=recovered)
            return RunStatus.PAUSED, None
        cur.history, cur.usage = messages, usage
        cur.decisions, cur.pending = {}, []
        if ended:
            cur.output = output
            finished = proto.ending_event("run.finished", cur.run_id, loop=self.name, status=RunStatus.DONE.value)
            await proto.save(cur, RunStatus.DONE, recovered=recovered, ending=finished)
            return RunStatus.DONE, None
        cur.stage = "tools"
        await proto.save(cur, RunStatus.RUNNING, recovered=recovered)
        return None, live

    async def _fail(
        self,
        proto: RunSteps[AgentCursor, AgentResult],
        cur: AgentCursor,
        why: str,
        recovered: dict[str, Any] | None = None,
    ) -> RunStatus:
        cur.error = why
        finished = proto.ending_event(
            "run.finished", cur.run_id, loop=self.name, status=RunStatus.FAILED.value, error=why
        )
        await proto.save(cur, RunStatus.FAILED, recovered=recovered, ending=finished)
        return RunStatus.FAILED
