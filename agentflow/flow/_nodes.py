"""The kinds of node a flow is built of: `Call` (one tool call), `Map` (one per element), `Wait`, a function.

A `Call` may need an approval (its tool says when); with ``timeout_s`` the approval has a
deadline, and ``on_timeout`` says what the deadline decides: ``"deny"``, ``"approve"``, or
the name of a node the run goes on from instead. A `Wait` holds the run's next superstep
back until a time: ``seconds`` after the superstep it is in, or ``until`` a time computed
from the state. Neither kind of wait holds a worker: the wake time is signed into the
run's checkpoint, and a sweeper wakes the run when it is due (`agentflow.flow._timers`).
A `Map` calls one tool per element of a list in the state, each call logged on its own
(identity ``superstep/node/index/argument digest``, so its own idempotency key), at most
``max_concurrency`` at a time, and joins the results in input order (`agentflow.flow._map`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from agentflow._errors import FlowError

_RAISE: Any = object()

#: What an approval's deadline may decide besides going to a node.
TIMEOUT_DECISIONS = ("deny", "approve")


@dataclass(frozen=True)
class Call:
    """A node that makes one tool call and (optionally) stores its result in a state field.

    Args:
        tool: the tool's name.
        args: a function of the state returning the keyword arguments, or a fixed mapping.
        into: the state field that receives the result (None: the result is dropped).
        on_deny: if given, the value put into `into` when an approval is denied (so the
            flow can branch on it); otherwise a denial fails the run.
        timeout_s: when the call waits for an approval, how long it waits before
            `on_timeout` decides (None: it waits for a person however long it takes).
        on_timeout: ``"deny"`` (as a person denying it: `on_deny` applies), ``"approve"``,
            or the name of a node the run goes on from instead of this call.
    """

    tool: str
    args: Callable[[Any], Mapping[str, Any]] | Mapping[str, Any] | None = None
    into: str | None = None
    on_deny: Any = field(default=_RAISE)
    timeout_s: float | None = None
    on_timeout: str = "deny"

    def __post_init__(self) -> None:
        if self.timeout_s is not None and not (_number(self.timeout_s) and self.timeout_s > 0):
            raise FlowError(f"Call({self.tool!r}): timeout_s must be a positive number of seconds ({self.timeout_s})")
        if not isinstance(self.on_timeout, str) or not self.on_timeout:
            raise FlowError(f"Call({self.tool!r}): on_timeout is 'deny', 'approve' or a node's name")

    def arguments(self, state: BaseModel) -> dict[str, Any]:
        """The call's arguments for `state`."""
        if self.args is None:
            return {}
        if callable(self.args):
            return dict(self.args(state))
        return dict(self.args)


@dataclass(frozen=True)
class Map:
    """A node that calls `tool` once per element of a list in the state, and joins the results in input order.

    Args:
        tool: the tool's name.
        over: a function of the state returning the elements (any sequence).
        args: a function of one element returning that call's arguments (default: ``{"item": element}``).
        into: the state field that receives the list of results (None: they are dropped).
        max_concurrency: how many calls run at once.
        collect_errors: False: one failing element fails the node (the others still finish
            and are logged). True: a failed element's result is None, and its error goes
            into `errors_into` (``{index: "Type: message"}``) when given.
        errors_into: the state field for the collected errors (a dict).

    Each element is a call of its own in the log: a crash replays the finished ones and
    applies the in-doubt rules to the rest. Records hold one element's arguments and
    result each, never the whole list.
    """

    tool: str
    over: Callable[[Any], Sequence[Any]]
    args: Callable[[Any], Mapping[str, Any]] | None = None
    into: str | None = None
    max_concurrency: int = 10
    collect_errors: bool = False
    errors_into: str | None = None

    def __post_init__(self) -> None:
        if not callable(self.over):
            raise FlowError(f"Map({self.tool!r}): over= is a function of the state returning the elements")
        if not (isinstance(self.max_concurrency, int) and self.max_concurrency >= 1):
            raise FlowError(f"Map({self.tool!r}): max_concurrency must be 1 or more, not {self.max_concurrency!r}")
        if self.errors_into is not None and not self.collect_errors:
            raise FlowError(f"Map({self.tool!r}): errors_into= needs collect_errors=True")

    def elements(self, state: BaseModel) -> list[Any]:
        """The elements of `state` to call the tool for.

        Raises:
            FlowError: `over` did not return a sequence.
        """
        found = self.over(state)
        if isinstance(found, str | bytes | Mapping) or not isinstance(found, Sequence):
            raise FlowError(f"Map({self.tool!r}): over= returned {type(found).__name__}; return a list of elements")
        return list(found)

    def arguments(self, element: Any) -> dict[str, Any]:
        """One call's arguments."""
        return {"item": element} if self.args is None else dict(self.args(element))


@dataclass(frozen=True)
class Child:
    """A node that starts another flow as a child run, waits for its end durably, and takes its result.

    Args:
        flow: the child's flow (in a distributed deployment, the workers' app must have it).
        state: a function of the parent's state returning the child's initial state.
        into: the parent's state field that receives the result (None: it is dropped).
        result: a function of the child's final state returning that result (default: the
            child's state as a dict).

    A child that fails or is cancelled fails this node. See `agentflow.flow.children`.
    """

    flow: Any
    state: Callable[[Any], Mapping[str, Any] | BaseModel]
    into: str | None = None
    result: Callable[[Any], Any] | None = None

    def initial(self, parent_state: BaseModel) -> BaseModel:
        """The child's initial state, made from the parent's and validated against the child flow's model.

        Raises:
            FlowError: it does not fit.
        """
        made = self.state(parent_state)
        model: type[BaseModel] = self.flow.state
        try:
            return made if isinstance(made, model) else model.model_validate(dict(made))
        except Exception as exc:
            where = f"the child of flow {self.flow.name!r}"
            raise FlowError(f"{where}: its state does not fit {model.__name__}: {exc}") from None


@dataclass(frozen=True)
class Wait:
    """A node that waits: the run's next superstep starts no earlier than the time it names.

    Give one of:
        seconds: how long to wait (a number, or a function of the state returning one).
        until: a function of the state returning when to wake (an aware `datetime`, or
            seconds since the epoch).

    A superstep that runs a `Wait` beside other nodes runs them, then waits for the latest
    wake time of its `Wait` nodes. A time already past wakes the run at once.
    """

    seconds: float | Callable[[Any], float] | None = None
    until: Callable[[Any], datetime | float] | None = None

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.until is None):
            raise FlowError("Wait takes seconds= or until= (one of them)")
        if self.seconds is not None and not callable(self.seconds):
            if not (_number(self.seconds) and self.seconds >= 0):
                raise FlowError(f"Wait(seconds={self.seconds!r}): give a number of seconds, 0 or more")

    def wake_at(self, state: BaseModel, now: float) -> float:
        """When a run whose state is `state` wakes, waiting from `now` (seconds since the epoch).

        Raises:
            FlowError: the function returned something that is not a time.
        """
        if self.until is not None:
            when = self.until(state)
            if isinstance(when, datetime):
                if when.tzinfo is None:
                    raise FlowError(f"Wait(until=...) returned {when!r} without a time zone; return an aware datetime")
                return when.timestamp()
            if _number(when):
                return float(when)
            raise FlowError(f"Wait(until=...) returned {when!r}; return a datetime or seconds since the epoch")
        seconds: Any = self.seconds(state) if callable(self.seconds) else self.seconds
        if not (_number(seconds) and seconds >= 0):
            raise FlowError(f"Wait(seconds=...) returned {seconds!r}; return a number of seconds, 0 or more")
        return now + float(seconds)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Node:
    """One node of a flow."""

    name: str
    action: Call | Map | Child | Wait | Callable[..., Any]
    max_visits: int
    takes_handle: bool = False
    is_async: bool = False


@dataclass(frozen=True)
class Edge:
    """An edge; `when` None means always followed."""

    src: str
    dst: str
    when: Callable[[Any], bool] | None = None


def label(fn: Callable[..., Any]) -> str:
    """A function's stable name (``module.qualname``), as the graph digest records it."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
