"""`Flow`: the graph builder, its node kinds, build-time validation and the graph digest.

A flow is nodes joined by edges over one pydantic state. The first node added is the
entry. A plain edge is always followed; an edge with ``when=`` only when its condition
holds on the state after the superstep. ``.end(name)`` marks a node where the run may
stop; an end node may still have conditional edges (a loop that ends when its condition
fails), but no plain ones.

A flow has a version (``"1"`` unless given). A run is signed with the version it started on
and continues on that version only (`agentflow.flow._versions`); the digest still guards a
version against silent change.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from agentflow._errors import FlowError
from agentflow._run_types import DEFAULT_VERSION
from agentflow.exec import Registry
from agentflow.exec.seal import digest
from agentflow.flow._nodes import _RAISE, TIMEOUT_DECISIONS, Call, Child, Edge, Map, Node, Wait, label

__all__ = ["DEFAULT_MAX_VISITS", "_RAISE", "Call", "Child", "Edge", "Flow", "Map", "Node", "Wait"]

S = TypeVar("S", bound=BaseModel)

#: Default limit of runs per node in one run (a cycle past it stops with FlowError).
DEFAULT_MAX_VISITS = 25


_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")


def _reducers(state: type[BaseModel]) -> dict[str, Callable[[Any, Any], Any]]:
    found: dict[str, Callable[[Any, Any], Any]] = {}
    for name, info in state.model_fields.items():
        for meta in info.metadata:
            if callable(meta) and not isinstance(meta, type):
                found[name] = meta
                break
    return found


class Flow(Generic[S]):
    """A graph of nodes over a pydantic state, built with `node`, `edge` and `end`."""

    def __init__(
        self, name: str, state: type[S], *, version: str = DEFAULT_VERSION, max_visits: int = DEFAULT_MAX_VISITS
    ) -> None:
        """Start a flow.

        Args:
            name: the flow's name; checkpoints and `recover_all` find runs by it.
            state: the pydantic model of the run's state.
            version: the flow's version (letters, digits, ``.``, ``_``, ``-``; up to 40):
                a run continues on the version it started on (see docs/versioning.md).
            max_visits: default limit of runs per node in one run.
        """
        if not name or not isinstance(name, str):
            raise FlowError("a flow needs a non-empty name")
        if not (isinstance(state, type) and issubclass(state, BaseModel)):
            raise FlowError(f"flow {name!r}: state must be a pydantic BaseModel class, not {state!r}")
        if not isinstance(version, str) or not _VERSION.fullmatch(version):
            raise FlowError(
                f"flow {name!r}: version {version!r} is not a version; use a short string of letters, digits, "
                "'.', '_' and '-' starting with a letter or digit, e.g. version=\"2\""
            )
        self.name = name
        self.version = version
        self.state = state
        self.max_visits = max_visits
        self.nodes: dict[str, Node] = {}
        self.edges: list[Edge] = []
        self.ends: set[str] = set()
        self.reducers = _reducers(state)
        self._checked: str | None = None

    def __repr__(self) -> str:
        return f"<Flow {self.name!r} version {self.version!r}: {len(self.nodes)} nodes>"

    @property
    def entry(self) -> str:
        """The first node added."""
        if not self.nodes:
            raise FlowError(f"flow {self.name!r} has no nodes; add one with .node(name, action)")
        return next(iter(self.nodes))

    def node(
        self, name: str, action: Call | Map | Child | Wait | Callable[..., Any], *, max_visits: int | None = None
    ) -> Flow[S]:
        """Add a node: a `Call`, a `Map`, a `Child`, a `Wait`, or a function ``(state)`` or ``(state, handle)``.

        A function (sync or async) returns a dict of the fields it changes (or None).

        Raises:
            FlowError: the name is taken, or the node names a field the state lacks.
        """
        if name in self.nodes:
            raise FlowError(f"flow {self.name!r}: a node named {name!r} already exists; give each node its own name")
        limit = max_visits if max_visits is not None else self.max_visits
        if isinstance(action, Call | Map | Child | Wait):
            self._check_fields(name, action)
            self.nodes[name] = Node(name, action, limit)
        elif callable(action):
            params = len(inspect.signature(action).parameters)
            if params not in (1, 2):
                raise FlowError(f"flow {self.name!r}, node {name!r}: a node function takes (state) or (state, handle)")
            self.nodes[name] = Node(name, action, limit, params == 2, inspect.iscoroutinefunction(action))
        else:
            raise FlowError(f"flow {self.name!r}, node {name!r}: the action is a Call, a Map, a Wait or a function")
        self._checked = None
        return self

    def _check_fields(self, name: str, action: Call | Map | Child | Wait) -> None:
        """Refuse a node whose action names a state field the state lacks (or a Child without a Flow)."""
        if isinstance(action, Child) and not isinstance(action.flow, Flow):
            raise FlowError(f"flow {self.name!r}, node {name!r}: Child(flow=...) takes a Flow")
        named = [] if isinstance(action, Wait) else [action.into]
        named += [action.errors_into] if isinstance(action, Map) else []
        for field_name in named:
            if field_name is not None and field_name not in self.state.model_fields:
                fields = ", ".join(self.state.model_fields) or "none"
                raise FlowError(
                    f"flow {self.name!r}, node {name!r}: {type(action).__name__}(into={field_name!r}) names a field "
                    f"{self.state.__name__} does not have (fields: {fields})"
                )

    def edge(self, src: str, dst: str, *, when: Callable[[S], bool] | None = None) -> Flow[S]:
        """Add an edge from `src` to `dst`, followed always or only `when` the condition holds."""
        self.edges.append(Edge(src, dst, when))
        self._checked = None
        return self

    def end(self, *names: str) -> Flow[S]:
        """Mark nodes where the run may end."""
        self.ends.update(names)
        self._checked = None
        return self

    def validate(self, registry: Registry | None = None) -> None:
        """Check the whole graph (and, given a registry, that every `Call`'s tool exists).

        Raises:
            FlowError: saying what to fix.
        """
        self._check_structure()
        for node in self.nodes.values():
            if isinstance(node.action, Child) and node.action.flow is not self:
                node.action.flow.validate(registry)
        if registry is not None:
            for node in self.nodes.values():
                if isinstance(node.action, Call | Map) and node.action.tool not in registry:
                    raise FlowError(
                        f"flow {self.name!r}, node {node.name!r} calls tool {node.action.tool!r}, "
                        "which the registry does not have; register it with @registry.tool"
                    )

    def _check_structure(self) -> None:
        if self._checked is not None:
            return
        self._check_names()
        self._check_exits()
        self._check_reachable()
        self._checked = self._digest()

    def _check_names(self) -> None:
        where = f"flow {self.name!r}"
        self.entry  # noqa: B018 - raises FlowError when the flow has no node
        for edge in self.edges:
            for end in (edge.src, edge.dst):
                if end not in self.nodes:
                    raise FlowError(f"{where}: edge {edge.src!r} -> {edge.dst!r} names unknown node {end!r}")
        for name in self.ends:
            if name not in self.nodes:
                raise FlowError(f"{where}: .end({name!r}) names an unknown node")
        for node in self.nodes.values():
            action = node.action
            if isinstance(action, Call) and action.on_timeout not in (*TIMEOUT_DECISIONS, *self.nodes):
                raise FlowError(
                    f"{where}, node {node.name!r}: on_timeout={action.on_timeout!r} is not 'deny', 'approve' "
                    "or a node of the flow"
                )

    def _check_exits(self) -> None:
        where = f"flow {self.name!r}"
        if not self.ends:
            raise FlowError(f"{where} has no end; mark the last node with .end(name)")
        for edge in self.edges:
            if edge.src in self.ends and edge.when is None:
                raise FlowError(f"{where}: end node {edge.src!r} has a plain edge to {edge.dst!r}; make it conditional")
        outgoing = {e.src for e in self.edges}
        for name in self.nodes:
            if name not in self.ends and name not in outgoing:
                raise FlowError(f"{where}: node {name!r} has no edge out and is not an end; add an edge or .end()")

    def _check_reachable(self) -> None:
        seen, todo = {self.entry}, [self.entry]
        while todo:
            here = todo.pop()
            action = self.nodes[here].action
            detour = [action.on_timeout] if isinstance(action, Call) and action.on_timeout in self.nodes else []
            for dst in [e.dst for e in self.edges if e.src == here] + detour:
                if dst not in seen:
                    seen.add(dst)
                    todo.append(dst)
        unreachable = [n for n in self.nodes if n not in seen]
        if unreachable:
            names = ", ".join(map(repr, unreachable))
            raise FlowError(f"flow {self.name!r}: node(s) {names} cannot be reached from {self.entry!r}")

    @property
    def digest(self) -> str:
        """Digest of the graph's structure and state schema (checked on recovery)."""
        self._check_structure()
        assert self._checked is not None
        return self._checked

    def _digest(self) -> str:
        nodes: list[list[Any]] = []
        for node in self.nodes.values():
            if isinstance(node.action, Call):
                call = node.action
                nodes.append([node.name, "call", call.tool, call.into, node.max_visits])
                if call.timeout_s is not None:  # only then: the digests of flows without deadlines stay as they were
                    nodes[-1] += [call.timeout_s, call.on_timeout]
            elif isinstance(node.action, Map):
                m = node.action
                args = label(m.args) if m.args else None
                shape = [label(m.over), args, m.into, m.max_concurrency, m.collect_errors, m.errors_into]
                nodes.append([node.name, "map", m.tool, *shape, node.max_visits])
            elif isinstance(node.action, Child):
                child = node.action
                made = [child.flow.name, child.flow.version, label(child.state), child.into]
                nodes.append([node.name, "child", *made, label(child.result) if child.result else None])
            elif isinstance(node.action, Wait):
                wait = node.action
                seconds = label(wait.seconds) if callable(wait.seconds) else wait.seconds
                nodes.append([node.name, "wait", seconds, label(wait.until) if wait.until else None, node.max_visits])
            else:
                nodes.append([node.name, "function", label(node.action), node.max_visits])
        edges = [[e.src, e.dst, label(e.when) if e.when else None] for e in self.edges]
        return digest(
            {
                "flow": self.name,
                "nodes": nodes,
                "edges": edges,
                "ends": sorted(self.ends),
                "state": self.state.model_json_schema(),
                "reducers": {name: label(fn) for name, fn in sorted(self.reducers.items())},
            }
        )
