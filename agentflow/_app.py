"""`FlowApp`: the flows and tools one deployment runs, found by import path.

The command line (``--app module:attr``), the Celery tasks and the run viewer all need
the same two things to act on a stored run: its flow, by name, and the registry of its
tools. A `FlowApp` bundles them. An app may hold several versions of one flow
(`FlowVersions`): new runs start on the newest, and each stored run continues on its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentflow._errors import FlowError
from agentflow._events import Events
from agentflow.exec import Approver, Executor, LoopRunner, Registry
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.driven import ProtocolRunner
from agentflow.exec.run.lease import DEFAULT_LEASE_S
from agentflow.exec.tracing import Tracer
from agentflow.flow import Flow, FlowRunner, FlowVersions
from agentflow.models import Message, Model


class LoopHost(Protocol):
    """What the app needs of a tool loop it runs: its tools, and its runner beside a flow runner.

    `LoopSpec` is one (a model and a registry); a pydantic-ai agent made durable
    (`agentflow.integrations.pydantic_ai.DurableAgent`) is another: its turns are the agent's.
    """

    @property
    def registry(self) -> Registry:
        """The tools the loop's model may call (what metrics and the call log know them by)."""
        ...

    def runner_beside(self, runner: FlowRunner, name: str) -> ProtocolRunner[Any, Any]:
        """The runner of the loops `name`, sharing `runner`'s store, key ring, hold, event hub and tracer."""
        ...


class LazyModel:
    """A loop's model, made by its factory on the first call (once per runner, so once per process)."""

    def __init__(self, factory: Callable[[], Model]) -> None:
        self._factory = factory
        self._model: Model | None = None

    @property
    def model(self) -> Model:
        """The model, made now if it was not yet."""
        if self._model is None:
            self._model = self._factory()
        return self._model

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        """See `Model.complete`."""
        return await self.model.complete(messages, tools)


@dataclass(frozen=True)
class LoopSpec:
    """A tool loop a deployment runs: its model, its tools, its budget."""

    model_factory: Callable[[], Model]
    """Makes the model (once per worker process)."""
    registry: Registry
    """The tools the model may call."""
    max_steps: int = 10
    """Model calls the whole run may make."""

    def runner_beside(self, runner: FlowRunner, name: str) -> LoopRunner:
        """A `LoopRunner` for the loops `name` beside `runner`; its model is made on first use (`LazyModel`)."""
        return LoopRunner.beside(runner, LazyModel(self.model_factory), self.registry, name=name)


class FlowApp:
    """A registry of tools, the flows that use them, and (optionally) tool loops."""

    def __init__(
        self, registry: Registry, flows: Iterable[Flow[Any]], *, loops: Mapping[str, LoopHost] | None = None
    ) -> None:
        """Bundle `flows` with their `registry`, and name the tool loops (`LoopSpec`, or a durable agent).

        Raises:
            FlowError: two flows share a name and a version, or a flow calls a tool the registry lacks.
        """
        self.registry = registry
        self.loops: dict[str, LoopHost] = dict(loops or {})
        gathered: dict[str, list[Flow[Any]]] = {}
        for flow in flows:
            flow.validate(registry)
            gathered.setdefault(flow.name, []).append(flow)
        #: Every flow's versions, by name.
        self.versions: dict[str, FlowVersions[Any]] = {name: FlowVersions(fs) for name, fs in gathered.items()}
        #: The newest version of every flow, by name (where new runs start).
        self.flows: dict[str, Flow[Any]] = {name: v.newest for name, v in self.versions.items()}

    def flow(self, name: str, version: str | None = None) -> Flow[Any]:
        """Return the flow called `name`: its newest version, or `version`.

        Raises:
            FlowError: no flow has that name, or it has no such version (the message lists the known ones).
        """
        flows = self.flow_versions(name)
        if version is None:
            return flows.newest
        found = flows.get(version)
        if found is None:
            known = ", ".join(flows.versions)
            raise FlowError(f"flow {name!r} has no version {version!r} in this app (versions: {known})")
        return found

    def flow_versions(self, name: str) -> FlowVersions[Any]:
        """Every version of the flow called `name` this app has (what acting on its stored runs needs).

        Raises:
            FlowError: no flow has that name (the message lists the known ones).
        """
        try:
            return self.versions[name]
        except KeyError:
            known = ", ".join(sorted(self.versions)) or "none"
            raise FlowError(f"unknown flow {name!r} (this app has: {known})") from None

    def has_version(self, name: str, version: str) -> bool:
        """Whether this app can carry on runs of flow `name` saved on `version`."""
        return name in self.versions and version in self.versions[name]

    def runner(
        self,
        store: CheckpointStore | None,
        checkpoint_key: bytes | Sequence[bytes] | None,
        *,
        approver: Approver | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        owner: str | None = None,
        events: Events | None = None,
        tracer: Tracer | None = None,
    ) -> FlowRunner:
        """A `FlowRunner` over this app's tools (see `FlowRunner` for `lease_s` and `owner`).

        Its runs report to `events`, and their spans to `tracer` (`agentflow.observe.Tracing`; off by default).
        """
        return FlowRunner(
            Executor(self.registry, approver=approver, events=events, tracer=tracer),
            checkpoints=store,
            checkpoint_key=checkpoint_key,
            lease_s=lease_s,
            owner=owner,
        )


def import_attribute(path: str, option: str, example: str) -> tuple[Any, str, str]:
    """Import what ``"package.module:attribute"`` names; return it (None if absent), the module's name and its own.

    Raises:
        ValueError: the path is malformed or its module cannot be imported (the message
            names `option` and shows `example`).
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{option} {path!r}: write it as package.module:attribute, e.g. {example}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{option} {path!r}: cannot import {module_name!r} ({exc})") from None
    return getattr(module, attr, None), module_name, attr


def load_app(path: str) -> FlowApp:
    """Import a `FlowApp` from ``"package.module:attribute"``.

    Raises:
        ValueError: the path is malformed, cannot be imported, or does not name a FlowApp.
    """
    app, module_name, attr = import_attribute(path, "--app", "my_company.agents:app")
    if not isinstance(app, FlowApp):
        raise ValueError(f"--app {path!r}: {attr!r} in {module_name!r} is not a FlowApp")
    return app
