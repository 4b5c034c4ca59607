"""Tools: a function plus what agentflow needs to call it safely, and the `Registry` of them.

A tool's arguments are validated by a pydantic model built from its signature before it
runs. Its options say how to run it (timeout, retries) and how to treat it after a crash
(`idempotent`) or before it runs (`approval`).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, TypeVar, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from agentflow._errors import ToolArgumentsInvalid, UnknownTool
from agentflow._identity import RunContext
from agentflow.exec.limits import BackendSpec, Limit, LimitKey
from agentflow.exec.limits.table import LimitTable
from agentflow.exec.seal import check_storable

F = TypeVar("F", bound=Callable[..., Any])

#: Decides per call whether it needs approval, from its validated arguments and the run's identity.
ApprovalPolicy = Callable[[Mapping[str, Any], RunContext | None], bool]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to retry a tool that raised."""

    attempts: int = 1
    """Total attempts, the first included (1 means no retry)."""
    backoff_s: float = 0.2
    """Delay before the first retry."""
    multiplier: float = 2.0
    """Factor applied to the delay after each retry."""
    max_backoff_s: float = 30.0
    """Upper bound of any one delay."""
    retry_on: tuple[type[Exception], ...] = (Exception,)
    """Exception types worth retrying; anything else fails at once."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1 (1 means: no retry)")
        if self.backoff_s < 0 or self.multiplier < 1 or self.max_backoff_s < 0:
            raise ValueError("RetryPolicy: delays must be >= 0 and multiplier >= 1")

    def delay(self, attempt: int) -> float:
        """Delay before attempt number `attempt + 1` (attempts count from 1)."""
        return float(min(self.max_backoff_s, self.backoff_s * self.multiplier ** (attempt - 1)))


_ARGS_CONFIG = ConfigDict(extra="forbid", arbitrary_types_allowed=False)


def _args_model(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args and **kwargs cannot be validated; name every parameter")
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"tool {name!r}: positional-only parameters are not supported (tools take keywords)")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    model: type[BaseModel] = create_model(f"{name}_args", __config__=_ARGS_CONFIG, **fields)
    return model


@dataclass(frozen=True, eq=False)
class Tool:
    """A registered tool. Build these with `Registry.tool`."""

    name: str
    fn: Callable[..., Any]
    description: str
    idempotent: bool
    """Safe to run again after a crash left it in doubt."""
    approval: bool | ApprovalPolicy
    """True: every call needs approval; a function decides per call; False: never."""
    retry: RetryPolicy
    timeout_s: float | None
    """Per-attempt timeout. A sync tool that overruns is abandoned, not stopped."""
    args_model: type[BaseModel] = field(repr=False)
    returns: TypeAdapter[Any] = field(repr=False)
    is_async: bool = False
    trace_args: bool = False
    """Its calls' spans show their arguments (JSON); off by default."""
    trace_result: bool = False
    """Its calls' spans show their results (JSON) and error messages; off by default."""
    limits: tuple[Limit, ...] = ()
    """The shared limits each attempt of a call takes a slot of (`agentflow.exec.limits`)."""
    waits: bool = False
    """A tool loop waits after a round of tools until the time it returns (an aware `datetime`)."""

    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Validate `args`, returning the keyword arguments to call the tool with.

        Raises:
            ToolArgumentsInvalid: naming the tool and every bad field.
        """
        return self.prepare(args)[0]

    def prepare(self, args: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Validate `args` once; return the keyword arguments and their JSON form (for the log).

        Raises:
            ToolArgumentsInvalid: naming the tool and every bad field.
        """
        try:
            model = self.args_model.model_validate(dict(args))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}" for err in exc.errors()
            )
            raise ToolArgumentsInvalid(f"tool {self.name!r} got bad arguments: {problems}") from None
        kwargs = {name: getattr(model, name) for name in self.args_model.model_fields}
        return kwargs, model.model_dump(mode="json")

    def encode_args(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON form of validated arguments (what the call log stores and digests)."""
        encoded: dict[str, Any] = self.args_model.model_validate(kwargs).model_dump(mode="json")
        return encoded

    def needs_approval(self, kwargs: Mapping[str, Any], ctx: RunContext | None) -> bool:
        """Whether this call must be approved before it runs."""
        if callable(self.approval):
            return bool(self.approval(kwargs, ctx))
        return bool(self.approval)

    def encode_result(self, value: Any) -> Any:
        """The JSON form of a result, for the call log.

        Raises:
            Exception: the value cannot be encoded (the call is then logged unrecordable).
        """
        check_storable(value, "result")  # pydantic's JSON mode would write NaN under Any as null
        return self.returns.dump_python(value, mode="json")

    def revive_result(self, stored: Any) -> Any:
        """Turn a stored result back into the tool's declared return type."""
        return self.returns.validate_python(stored)

    def schema(self) -> dict[str, Any]:
        """JSON schema of the tool, as model adapters hand it to a model (a copy of its own to change)."""
        return copy.deepcopy(self._schema)

    @cached_property
    def _schema(self) -> dict[str, Any]:
        # Built once: pydantic builds a JSON schema in about a millisecond, and a tool loop asks for
        # every tool's schema at each model turn. A tool's arguments model never changes.
        params = self.args_model.model_json_schema()
        params.pop("title", None)
        return {"name": self.name, "description": self.description, "parameters": params}


class Registry:
    """The tools a worker can run, by name, and the limits their calls share."""

    def __init__(self, *, limit_backend: BackendSpec = None) -> None:
        """A registry with no tools yet.

        Args:
            limit_backend: where the state of its limits lives, shared by every process
                naming the same one: None or ``"local"`` (this process only), a Redis URL
                (``redis://host:6379/0``, ``#prefix`` at the end to set the key prefix), a
                factory, or a `LimitBackend`. Nothing connects until a limited call runs,
                and each process (a Celery prefork child) makes its own client.
        """
        self._tools: dict[str, Tool] = {}
        self.limits = LimitTable(limit_backend)
        """The limits declared on this registry, and their backend."""

    def limit(
        self,
        name: str | Limit,
        /,
        *,
        concurrency: int | None = None,
        per_second: int | None = None,
        per_minute: int | None = None,
        key: LimitKey | None = None,
    ) -> Limit:
        """Declare a limit that tools name (``limits=[name]``) and that model calls of provider `name` take.

        Args:
            name: the limit's name (a model provider's, e.g. ``"openai"``, covers that
                provider's model calls in tool loops), or a whole `Limit`.
            concurrency: at most this many calls in flight, on every worker together.
            per_second: at most this many calls start in any one-second window.
            per_minute: at most this many calls start in any one-minute window.
            key: a tenant key ``(args, ctx) -> str``: each key gets its own slots and window.

        Raises:
            ValueError: the name is taken, or the options make no limit.
        """
        if isinstance(name, Limit):
            if (concurrency, per_second, per_minute, key) != (None, None, None, None):
                raise ValueError("give either a Limit or the options of one, not both")
            return self.limits.declare(name)
        if per_second is not None and per_minute is not None:
            raise ValueError(f"limit {name!r}: give per_second or per_minute, not both")
        rate, interval_s = (per_second, 1.0) if per_minute is None else (per_minute, 60.0)
        return self.limits.declare(Limit(name, concurrency=concurrency, rate=rate, interval_s=interval_s, key=key))

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        idempotent: bool = False,
        approval: bool | ApprovalPolicy = False,
        retries: int = 0,
        backoff_s: float = 0.2,
        retry_on: tuple[type[Exception], ...] = (Exception,),
        timeout_s: float | None = None,
        description: str | None = None,
        trace_args: bool = False,
        trace_result: bool = False,
        limits: Sequence[str | Limit] = (),
        waits: bool = False,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        idempotent: bool = False,
        approval: bool | ApprovalPolicy = False,
        retries: int = 0,
        backoff_s: float = 0.2,
        retry_on: tuple[type[Exception], ...] = (Exception,),
        timeout_s: float | None = None,
        description: str | None = None,
        trace_args: bool = False,
        trace_result: bool = False,
        limits: Sequence[str | Limit] = (),
        waits: bool = False,
    ) -> Any:
        """Register a sync or async function as a tool (usable bare or with options).

        Args:
            fn: the function (when used as ``@registry.tool`` without parentheses).
            name: the tool's name; defaults to the function's.
            idempotent: running it twice has the effect of running it once.
            approval: True, or a policy ``(args, ctx) -> bool``, to pause for approval first.
            retries: extra attempts after a failure (0: none).
            backoff_s: first delay between attempts; it doubles each time.
            retry_on: exception types to retry.
            timeout_s: per-attempt timeout in seconds.
            description: for the model; defaults to the docstring's first paragraph.
            trace_args: show the calls' arguments in their trace spans (off: a span carries
                the tool, the call id and the outcome, nothing the call was given).
            trace_result: show the calls' results and error messages in their spans.
            limits: the shared limits its calls take: names of limits declared with
                `limit` before it, or `Limit`s of its own (unnamed: named after the tool).
            waits: the tool returns a time (an aware `datetime`) until which a tool loop
                that called it waits, durably, before its next model call (see docs/timers.md).

        Raises:
            ValueError: the name is taken, an option is out of range, or a limit is not declared.
        """

        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            self.add(
                func,
                name=name,
                idempotent=idempotent,
                approval=approval,
                retry=RetryPolicy(attempts=retries + 1, backoff_s=backoff_s, retry_on=retry_on),
                timeout_s=timeout_s,
                description=description,
                trace_args=trace_args,
                trace_result=trace_result,
                limits=limits,
                waits=waits,
            )
            return func

        return register(fn) if fn is not None else register

    def add(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        idempotent: bool = False,
        approval: bool | ApprovalPolicy = False,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        description: str | None = None,
        trace_args: bool = False,
        trace_result: bool = False,
        limits: Sequence[str | Limit] = (),
        waits: bool = False,
    ) -> Tool:
        """Register `fn` and return its `Tool` (the non-decorator form of `tool`)."""
        tool_name = name or getattr(fn, "__name__", None)
        if not tool_name or not isinstance(tool_name, str):
            raise ValueError("a tool needs a name: pass name=...")
        if tool_name in self._tools:
            raise ValueError(f"a tool named {tool_name!r} is already registered")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"tool {tool_name!r}: timeout_s must be positive")
        hints = get_type_hints(fn)
        if waits and hints.get("return") is not datetime:
            raise ValueError(f"tool {tool_name!r}: a waiting tool returns the time to wake at: annotate it -> datetime")
        doc = inspect.getdoc(fn) or ""
        tool = Tool(
            name=tool_name,
            fn=fn,
            description=description if description is not None else doc.split("\n\n")[0],
            idempotent=idempotent,
            approval=approval,
            retry=retry or RetryPolicy(),
            timeout_s=timeout_s,
            args_model=_args_model(fn, tool_name),
            returns=TypeAdapter(hints.get("return", Any)),
            is_async=inspect.iscoroutinefunction(fn),
            trace_args=trace_args,
            trace_result=trace_result,
            limits=self.limits.resolve(tool_name, limits),
            waits=waits,
        )
        self._tools[tool_name] = tool
        return tool

    def get(self, name: str) -> Tool:
        """Return the tool called `name`.

        Raises:
            UnknownTool: no tool has that name.
        """
        try:
            return self._tools[name]
        except KeyError:
            known = ", ".join(sorted(self._tools)) or "none"
            raise UnknownTool(f"no tool named {name!r} is registered (registered: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """JSON schemas of every tool."""
        return [tool.schema() for tool in self._tools.values()]
