"""The agent's tools in the call log: an agentflow `Tool` per pydantic-ai tool, and the toolset that logs each call.

pydantic-ai validates a tool's arguments and calls it through its toolsets; agentflow logs
each call (`agentflow.exec.calls.log.CallLog`). `CallLogToolset` sits around the agent's
assembled toolset (put there per run by `Durability`, a pydantic-ai capability): each
`call_tool` becomes `CallLog.call` of the agent tool of that name, whose function calls the
wrapped toolset back with the run context pydantic-ai gave (`_PENDING`, a context variable:
the executor runs an async tool in the caller's task). The log stores the arguments as
``{"args": {...}}`` (the agentflow tool takes them as one argument; pydantic-ai checks them).

A stage that starts pydantic-ai afresh from the saved history (on a worker, after a crash)
would count a tool's retries from 0: the toolset counts them from the history instead
(`retries_used`, by pydantic-ai's rule) and ends the run as pydantic-ai would once a tool
that raised `ModelRetry` has used its ``max_retries``.

A `ModelRetry` a tool raised is logged as its result, in an envelope (``{RETRY_KEY: message}``).
A tool's own result cannot pass for one: a result of that shape, or of the shape of the
envelope that keeps such results (``{PLAIN_KEY: ...}``), is logged inside the latter, so live
and replayed alike it comes back to pydantic-ai as the tool returned it (`stored`, `returned`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Final

from pydantic_ai import ModelRetry
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, RetryPromptPart, ToolReturnPart
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, ToolsetTool, WrapperToolset
from pydantic_core import to_jsonable_python

from agentflow._errors import ApprovalDenied
from agentflow.exec import Registry, Tool
from agentflow.exec.calls.log import CallLog

__all__ = ["PLAIN_KEY", "RETRY_KEY", "AgentTools", "CallLogToolset", "Durability", "Stage", "retries_used"]

#: How a `ModelRetry` a tool raised is stored as its result.
RETRY_KEY: Final = "agentflow.model_retry"
#: How a tool's own result that has the shape of an envelope (this one's, or `RETRY_KEY`'s) is stored.
PLAIN_KEY: Final = "agentflow.result"
_ENVELOPES: Final = frozenset({RETRY_KEY, PLAIN_KEY})


def _envelope(value: Any) -> str | None:
    """The envelope key `value` is shaped as, in its JSON form (what a replay reads back), or None."""
    if not isinstance(value, dict):
        try:
            value = to_jsonable_python(value)
        except Exception:  # the log cannot store it either: it says so when it tries
            return None
    if isinstance(value, dict) and len(value) == 1:
        (key,) = value
        return key if key in _ENVELOPES else None
    return None


def stored(result: Any) -> Any:
    """A tool's own result as the call log keeps it: as it is, unless shaped as an envelope (then in `PLAIN_KEY`'s)."""
    return {PLAIN_KEY: result} if _envelope(result) is not None else result


def returned(value: Any) -> Any:
    """What a logged result (live or replayed) gives pydantic-ai: the tool's own result, or its `ModelRetry` raised.

    Raises:
        ModelRetry: the tool raised it (the value is ``{RETRY_KEY: message}``).
    """
    kind = _envelope(value)
    if kind == RETRY_KEY:
        raise ModelRetry(str(value[RETRY_KEY]))
    return value[PLAIN_KEY] if kind == PLAIN_KEY else value


@dataclass
class _Pending:
    """The call pydantic-ai is making, for the agent tool's function to make."""

    toolset: AbstractToolset[Any]
    name: str
    ctx: RunContext[Any]
    tool: ToolsetTool[Any]


_PENDING: ContextVar[_Pending | None] = ContextVar("agentflow_pydantic_ai_call", default=None)


def _through(name: str) -> Any:
    """The function of the agent tool `name`: make the pending pydantic-ai call; a `ModelRetry` is a result."""

    async def call(args: dict[str, Any]) -> Any:
        pending = _PENDING.get()
        if pending is None or pending.name != name:
            raise RuntimeError(f"tool {name!r} of a durable agent runs only inside the agent's run")
        try:
            result = await pending.toolset.call_tool(name, args, pending.ctx, pending.tool)
        except ModelRetry as exc:
            return {RETRY_KEY: exc.message}
        return stored(result)

    call.__name__ = name
    return call


class AgentTools:
    """The agent's tools as agentflow knows them: idempotent or not, needing approval or not."""

    def __init__(
        self, toolsets: Collection[AbstractToolset[Any]], idempotent: Collection[str], approval: Collection[str]
    ) -> None:
        self.idempotent, self.approval = frozenset(idempotent), frozenset(approval)
        self.registry = Registry()
        for toolset in toolsets:  # the tools known before any run (a function toolset's); others on first call
            if isinstance(toolset, FunctionToolset):
                for name, tool in toolset.tools.items():
                    self.add(name, tool.metadata, approval=tool.requires_approval)

    def add(self, name: str, metadata: dict[str, Any] | None = None, *, approval: bool = False) -> Tool:
        """Register the agent tool `name`.

        It is idempotent if declared so, or if its metadata says ``idempotent``; it needs a
        person's approval if declared so, or if pydantic-ai's ``requires_approval`` says so.
        """
        if name in self.registry:
            return self.registry.get(name)
        idempotent = name in self.idempotent or bool((metadata or {}).get("idempotent", False))
        approval = approval or name in self.approval
        return self.registry.add(_through(name), name=name, idempotent=idempotent, approval=approval)


@dataclass
class Stage:
    """What the toolset of a run needs from the stage under way (one object: pydantic-ai copies toolsets)."""

    tools: AgentTools
    log: CallLog | None = None
    """The call log of the tools stage under way (None in a model stage: no tool may run then)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One call at a time: the log's order is the order the calls started."""
    broken: bool = False
    """A call of the round raised: pydantic-ai is ending the round, so no waiting call may start."""


@dataclass
class CallLogToolset(WrapperToolset[Any]):
    """The agent's toolset with every call logged: `started` before it runs, its result after."""

    stage: Stage | None = None

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """The wrapped tools; one pydantic-ai would defer for approval is ours to approve (the run pauses)."""
        tools = await super().get_tools(ctx)
        for name, tool in list(tools.items()):
            if tool.tool_def.kind == "unapproved" and self.stage is not None:
                self.stage.tools.add(name, tool.tool_def.metadata, approval=True)
                tools[name] = replace(tool, tool_def=replace(tool.tool_def, kind="function"))
        return tools

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """Make (or replay from the log) one tool call."""
        stage = self.stage
        if stage is None or stage.log is None:
            raise RuntimeError(f"tool {name!r} was called outside a tools stage of a durable agent")
        stage.tools.add(name, tool.tool_def.metadata)
        ordinal = _ordinal(ctx)
        used = retries_used(ctx.messages, name)
        ctx = replace(ctx, retry=used, retries={**ctx.retries, name: used})
        async with stage.lock:
            if stage.broken:  # another call of the round failed: its siblings are being cancelled
                raise asyncio.CancelledError(f"tool {name!r} not started: another call of its round failed")
            agreed = stage.tools.registry.get(name).approval is not False  # the log asks the person first
            token = _PENDING.set(
                _Pending(self.wrapped, name, replace(ctx, tool_call_approved=True) if agreed else ctx, tool)
            )
            try:
                value = await stage.log.call("tools", ordinal, name, {"args": tool_args})
            except ApprovalDenied as exc:  # a person said no: the model is told, as a tool loop's is
                return f"denied: {exc}"
            except BaseException:
                stage.broken = True
                raise
            finally:
                _PENDING.reset(token)
        if _envelope(value) == RETRY_KEY and used >= tool.max_retries:  # what pydantic-ai raises, counted over the run
            raise UnexpectedModelBehavior(f"Tool {name!r} exceeded max retries count of {tool.max_retries}")
        return returned(value)


def retries_used(messages: list[ModelMessage], name: str) -> int:
    """The retries tool `name` has used before the response being handled, as pydantic-ai counts them in one run.

    Each request that carries the tool's results is a step: one where it failed (`ModelRetry`,
    or arguments that did not validate: a retry prompt, or a return marked ``retried``) adds
    one, one where it only succeeded sets the count back to 0.
    """
    used = 0
    for message in messages:
        if not isinstance(message, ModelRequest):
            continue
        mine = [part for part in message.parts if getattr(part, "tool_name", None) == name]
        if any(_retried(part) for part in mine):
            used += 1
        elif any(isinstance(part, ToolReturnPart) for part in mine):
            used = 0
    return used


def _retried(part: Any) -> bool:
    """Whether a part of a request is a tool's retry: a retry prompt, or (newer pydantic-ai) a return marked so."""
    return isinstance(part, RetryPromptPart) or getattr(part, "outcome", None) == "retried"


def _ordinal(ctx: RunContext[Any]) -> int:
    """The call's place among the tool calls of the response being handled (its log identity)."""
    for message in reversed(ctx.messages):
        if isinstance(message, ModelResponse):
            for index, part in enumerate(message.tool_calls):
                if part.tool_call_id == ctx.tool_call_id:
                    return index
            break
    raise RuntimeError(f"tool call {ctx.tool_call_id!r} is not in the response being handled")


@dataclass
class Durability(AbstractCapability[Any]):
    """The per-run capability that puts `CallLogToolset` around the agent's toolset."""

    stage: Stage

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        """Wrap the agent's assembled (non-output) toolset."""
        return CallLogToolset(toolset, stage=self.stage)
