"""A durable agent's `deps`: the factory that rebuilds them on each worker, checked as early as it can be.

pydantic-ai hands an agent's tools ``ctx.deps``. A durable run's stages may each run on another
worker, so the deps are never stored: `DurableAgent(deps=...)` takes a factory, called with an
`AgentInput` (the run id, and the JSON ``deps_data`` the run was started with, signed into its
step 0) wherever a stage runs. Each mistake with it is caught at the first moment it can be
seen, with what to pass instead:

- At construction (`check_factory`): a factory that is not callable (the deps themselves were
  given), one that cannot be called with one argument, or none for an agent that declares a
  ``deps_type``.
- At a run's start (`check_start`): ``deps_data`` for an agent with no factory (it would be
  signed and never read).
- When a stage builds them (`build`): a factory that raises (a key missing from ``deps_data``,
  say) or returns something other than the agent's ``deps_type``; the run fails with a message
  naming the factory, the ``deps_data`` keys it got and what to do, never a bare ``KeyError``
  from inside a tool.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic_ai.agent import AbstractAgent

_HINT = "DurableAgent(agent, deps=lambda run: MyDeps(...run.data...)), where run.data is the run's deps_data"


@dataclass(frozen=True)
class AgentInput:
    """What the `deps` factory gets to rebuild a run's dependencies on any worker."""

    run_id: str
    data: Mapping[str, Any]
    """The JSON `deps_data` the run was started with (signed into its step 0, in clear: no secrets)."""


#: What pydantic-ai reports for an agent that declared no deps type (``object``, its default) or none at all.
_UNDECLARED: Final = (None, object, type(None), Any)


def declared(agent: AbstractAgent[Any, Any]) -> Any:
    """The deps type `agent` declares (``Agent(deps_type=...)``), or None when it declares none."""
    deps_type = getattr(agent, "deps_type", None)
    return None if any(deps_type is undeclared for undeclared in _UNDECLARED) else deps_type


def check_factory(agent: AbstractAgent[Any, Any], name: str, deps: object) -> None:
    """Refuse a `deps` argument that cannot build `agent`'s deps.

    Raises:
        TypeError: `deps` is not a one-argument callable.
        ValueError: `agent` declares a deps type and `deps` is None.
    """
    wanted = declared(agent)
    if deps is None:
        if wanted is not None:
            raise ValueError(
                f"agent {name!r} takes deps of type {_name(wanted)} and no deps factory was given: "
                f"each worker rebuilds them, so pass {_HINT}"
            )
        return
    if not callable(deps):
        raise TypeError(
            f"deps of agent {name!r} must be a factory, not the deps themselves (got {type(deps).__name__}): "
            f"deps are rebuilt on whichever worker runs a stage, so pass {_HINT}"
        )
    try:
        inspect.signature(deps).bind(AgentInput("run", {}))
    except TypeError:
        raise TypeError(
            f"the deps factory of agent {name!r} must take one argument, an AgentInput (run_id, data): {_HINT}"
        ) from None
    except ValueError:  # a builtin or C callable without a signature: it is tried when a stage runs
        return


def check_start(name: str, deps: object, deps_data: Mapping[str, Any]) -> None:
    """Refuse `deps_data` for an agent with no deps factory: it would be signed into the run and never read.

    Raises:
        ValueError: `deps_data` is not empty and `deps` is None.
    """
    if deps_data and deps is None:
        raise ValueError(
            f"agent {name!r} has no deps factory, so deps_data {sorted(deps_data)} would never be read: "
            f"start without deps_data, or give {_HINT}"
        )


def build(agent: AbstractAgent[Any, Any], name: str, deps: Callable[[AgentInput], Any] | None, run: AgentInput) -> Any:
    """The deps of one stage of run `run` (None without a factory).

    Raises:
        ValueError: the factory raised, or returned something that is not the agent's deps type.
    """
    if deps is None:
        return None
    got = sorted(run.data)
    try:
        built = deps(run)
    except Exception as exc:
        raise ValueError(
            f"the deps factory of agent {name!r} raised {type(exc).__name__}: {exc} (run {run.run_id!r}, "
            f"deps_data keys {got}; the factory reads run.data, the run's deps_data). If it needs other "
            "deps_data, start a new run with it (deps_data is signed into a run's first checkpoint); if it "
            "failed for a passing reason, retry the run"
        ) from exc
    if not _fits(built, declared(agent)):
        wanted = declared(agent)
        raise ValueError(
            f"the deps factory of agent {name!r} returned {type(built).__name__}, and the agent takes "
            f"{_name(wanted)} (run {run.run_id!r}): make the factory return a {_name(wanted)}"
        )
    return built


def _fits(built: Any, wanted: Any) -> bool:
    """Whether `built` is of the declared deps type, where a plain class can tell.

    A generic alias or a protocol that is not runtime-checkable cannot tell: it fits.
    """
    if wanted is None or not isinstance(wanted, type):
        return True
    try:
        return isinstance(built, wanted)
    except TypeError:
        return True


def _name(kind: Any) -> str:
    return getattr(kind, "__qualname__", None) or repr(kind)
