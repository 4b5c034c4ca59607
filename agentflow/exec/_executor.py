"""`Executor`: runs one tool call (validation, approval port, limits, timeout, retries, events).

The executor knows nothing about durability: the call log (`calls.log.py`) wraps each call
with its records. Sync tools run off the event loop on the executor the caller chose
(default: `asyncio.to_thread`'s pool); the current call's `CallInfo` is visible inside them.
Each attempt of a call holds a slot of every limit of its tool (`limits._gate`, on the
backend its registry names); waiting for one is not part of the tool's timeout. A logged
call's first attempt runs on the slots the call log took before it logged ``started``
(``held``); every later attempt takes its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentflow._errors import ApprovalDenied, LeaseLost, RateLimited, ToolTimeout
from agentflow._events import Events
from agentflow._identity import RunContext
from agentflow.exec._registry import Registry, Tool
from agentflow.exec.context import CallInfo, _current
from agentflow.exec.limits.gate import Gate, Slots
from agentflow.exec.tracing import NO_SPAN, NO_TRACING, CallSpan, Tracer


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A call waiting for a person (or a policy) to allow it."""

    call_id: str
    """The call's deterministic identity."""
    tool: str
    """The tool that would run."""
    args: dict[str, Any]
    """Its validated arguments, in JSON form."""
    node: str
    """The flow node (or loop stage) that made the call."""
    ctx: RunContext | None = None
    """Who the run acts for."""


#: A synchronous approval port: asked inline, may block (a prompt, a chat message). Returns the decision.
Approver = Callable[[ApprovalRequest], bool | Awaitable[bool]]


class Executor:
    """Runs tool calls from a `Registry`."""

    def __init__(
        self,
        registry: Registry,
        *,
        approver: Approver | None = None,
        sync_executor: concurrent.futures.Executor | None = None,
        events: Events | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        """Build an executor.

        Args:
            registry: where tools are looked up by name.
            approver: a synchronous approval port; without one, a call that needs approval
                pauses the run instead.
            sync_executor: where sync tools run (default: the event loop's default executor).
            events: the hub to report to (a new one by default).
            tracer: where the runs of this executor report their spans
                (`agentflow.observe.Tracing`; off by default).
        """
        self.registry = registry
        self.approver = approver
        self.events = events if events is not None else Events()
        self.tracer: Tracer = tracer if tracer is not None else NO_TRACING
        self._sync_executor = sync_executor
        self.gate = Gate(registry.limits.backend, lambda: self.events)
        """Where calls (and a tool loop's model calls) take the slots of their limits."""

    async def ask_approver(self, request: ApprovalRequest) -> bool:
        """Ask the approval port about a call (a sync port runs off the event loop)."""
        if self.approver is None:
            raise RuntimeError("no approval port is configured")
        if inspect.iscoroutinefunction(self.approver):
            return bool(await self.approver(request))
        answer = await self._off_loop(self.approver, request)
        if inspect.isawaitable(answer):
            answer = await answer
        return bool(answer)

    async def run(
        self,
        tool: Tool | str,
        args: Mapping[str, Any],
        *,
        call: CallInfo | None = None,
        validated: bool = False,
        approved: bool = False,
        span: CallSpan = NO_SPAN,
        ctx: RunContext | None = None,
        held: Slots | None = None,
        before: Callable[[], Awaitable[None]] | None = None,
    ) -> Any:
        """Run one call: validate, ask the approval port if needed, then attempt it.

        Args:
            tool: the tool or its name.
            args: keyword arguments.
            call: the call's identity (for `idempotency_key()` and events).
            validated: `args` already went through `Tool.validate`.
            approved: the call's approval was already settled (the call log asks the
                port itself, after logging ``started``).
            span: the call's span (told of each attempt).
            ctx: who the run acts for (its limits' tenant keys may depend on it).
            held: the slots of the tool's limits, already taken for this call (`Gate.take`):
                the first attempt runs on them and gives them back; later attempts take their own.
            before: awaited right before each attempt runs, once it holds its slots (the call
                log confirms its worker's lease there), and by the tool itself through
                `CallInfo.confirm_held`; what it raises ends the call (untried, or cut short
                by the tool before its effect), with no retry.

        Raises:
            UnknownTool, ToolArgumentsInvalid: before anything runs.
            ApprovalDenied: the call needs approval and the port denied it, or there is no
                port (outside a flow nothing can pause for a person).
            ToolTimeout: the last attempt timed out.
            RateLimited: the tool kept raising it past its limits' `retries_429`.
            Exception: whatever the tool raised on its last attempt.
        """
        spec = self.registry.get(tool) if isinstance(tool, str) else tool
        kwargs = dict(args) if validated else spec.validate(args)
        run_id = call.run_id if call else None
        call_id = call.call_id if call else None
        if not approved and spec.needs_approval(kwargs, None):
            request = ApprovalRequest(call_id or spec.name, spec.name, spec.encode_args(kwargs), "")
            if self.approver is None:
                raise ApprovalDenied(f"tool {spec.name!r} needs approval and this executor has no approval port")
            if not await self.ask_approver(request):
                raise ApprovalDenied(f"call of {spec.name!r} was denied by the approval port")
        attempt = 1
        while True:
            info = CallInfo(run_id or "", call_id or spec.name, spec.name, attempt, held=before)
            span.attempt(attempt)
            began = [time.perf_counter()]  # reset when the attempt starts, past any wait for a slot
            who = {"run_id": run_id, "tool": spec.name, "call_id": call_id}
            first, held = held, None
            try:
                result = await self.gate.run(
                    spec.limits,
                    kwargs,
                    ctx,
                    who,
                    functools.partial(self._started, spec, kwargs, info, who, began, before),
                    held=first,
                )
            except (ApprovalDenied, LeaseLost):
                raise
            except Exception as exc:
                ms = round((time.perf_counter() - began[0]) * 1000, 3)
                if not isinstance(exc, spec.retry.retry_on) or attempt >= spec.retry.attempts:
                    self.events.emit("tool.failed", run_id, tool=spec.name, call_id=call_id, error=repr(exc), ms=ms)
                    raise
                delay = spec.retry.delay(attempt)
                if isinstance(exc, RateLimited):  # no limit of the tool took it: wait here as asked
                    delay = max(delay, exc.retry_after_s)
                self.events.emit(
                    "tool.retrying", run_id, tool=spec.name, call_id=call_id, attempt=attempt, delay_s=delay
                )
                await asyncio.sleep(delay)
                attempt += 1
                continue
            ms = round((time.perf_counter() - began[0]) * 1000, 3)
            self.events.emit("tool.finished", run_id, tool=spec.name, call_id=call_id, ms=ms)
            return result

    async def _started(
        self,
        spec: Tool,
        kwargs: dict[str, Any],
        info: CallInfo,
        who: dict[str, Any],
        began: list[float],
        before: Callable[[], Awaitable[None]] | None,
    ) -> Any:
        """One attempt, once its limits let it start (and `before` let it): reported as started, timed from now."""
        if before is not None:
            await before()
        self.events.emit("tool.started", who["run_id"], tool=spec.name, call_id=who["call_id"], attempt=info.attempt)
        began[0] = time.perf_counter()
        return await self._attempt(spec, kwargs, info)

    async def _attempt(self, spec: Tool, kwargs: dict[str, Any], info: CallInfo) -> Any:
        token = _current.set(info)
        try:
            if spec.is_async:
                work: Awaitable[Any] = spec.fn(**kwargs)
            else:
                work = self._off_loop(functools.partial(spec.fn, **kwargs))
            if spec.timeout_s is None:
                return await work
            try:
                async with asyncio.timeout(spec.timeout_s):
                    return await work
            except TimeoutError:
                raise ToolTimeout(f"tool {spec.name!r} did not finish within {spec.timeout_s}s") from None
        finally:
            _current.reset(token)

    def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._sync_executor, functools.partial(context.run, fn, *args))
