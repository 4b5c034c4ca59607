"""A registry's limits: the named ones, which of them each tool and each model provider takes, and the backend.

Invariants:
- A name means one limit per registry; a tool names only limits declared before it, so a
  typo fails at import, not at the first call.
- A model call takes the limit named after its provider: the model's ``provider``
  attribute, else the adapter's module (``agentflow.models.openai`` -> ``openai``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from agentflow.exec.limits._backends import BackendRef, BackendSpec
from agentflow.exec.limits._spec import Limit


def provider_of(model: Any) -> str | None:
    """The provider a model calls, for its limit: its ``provider`` attribute, else its adapter's module name."""
    named = getattr(model, "provider", None)
    if isinstance(named, str):
        return named
    module = type(model).__module__
    return module.rsplit(".", 1)[1] if module.startswith("agentflow.models.") else None


class LimitTable:
    """The limits of one registry, by name, and where their state lives."""

    def __init__(self, backend: BackendSpec = None) -> None:
        self.backend = BackendRef(backend)
        self._named: dict[str, Limit] = {}

    def declare(self, limit: Limit) -> Limit:
        """Declare a named limit (see `Registry.limit`).

        Raises:
            ValueError: it has no name, or its name is taken.
        """
        if not limit.name:
            raise ValueError("a limit declared on the registry needs a name")
        if limit.name in self._named:
            raise ValueError(f"a limit named {limit.name!r} is already declared")
        self._named[limit.name] = limit
        return limit

    def resolve(self, tool: str, limits: Sequence[str | Limit]) -> tuple[Limit, ...]:
        """The limits a tool takes: names of declared limits, or limits of its own.

        A limit of its own with no name is named after the tool and declared with it.

        Raises:
            ValueError: a name is not declared (declare limits before the tools naming them).
        """
        found: list[Limit] = []
        for each in limits:
            if isinstance(each, str):
                if each not in self._named:
                    raise ValueError(
                        f"tool {tool!r} names the limit {each!r}, which is not declared: "
                        f"call registry.limit({each!r}, ...) before registering the tool"
                    )
                found.append(self._named[each])
            else:
                found.append(self.declare(each if each.name else replace(each, name=tool)))
        return tuple(found)

    def of_model(self, model: Any) -> tuple[Limit, ...]:
        """The limits a call of `model` takes: the one named after its provider, if declared."""
        provider = provider_of(model)
        return (self._named[provider],) if provider is not None and provider in self._named else ()

    def get(self, name: str) -> Limit:
        """The limit called `name`.

        Raises:
            KeyError: none is.
        """
        return self._named[name]

    def __iter__(self) -> Iterator[Limit]:
        return iter(self._named.values())
