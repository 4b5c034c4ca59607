"""The tool-loop half of a worker: its loops, their models, and one stage of a loop (a mixin of `Worker`).

A stage is what a superstep is for a flow: a model call or one round of tools, run through
the run protocol under the loop's lease (`advance_tool_loop`), or, for a ``wake`` message,
the first stage after a waiting tool's time came (`wake_tool_loop`). A model is made once
per worker process, on its first use.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from typing import Any

from agentflow._app import LoopSpec
from agentflow._errors import FlowError
from agentflow._events import Events
from agentflow._identity import RunContext
from agentflow.celery._settings import WorkerSettings
from agentflow.exec._durable_loop import (
    LoopResult,
    advance_tool_loop,
    decide_tool_loop,
    wake_tool_loop,
)
from agentflow.exec._tracing import Tracer
from agentflow.exec.checkpoints._protocol import CheckpointStore
from agentflow.models._protocol import Model


class LoopWork:
    """Tool loops on a worker (`Worker` provides the store, key, settings, owner, hub and tracer)."""

    loops: Mapping[str, LoopSpec]
    _models: dict[str, Model]
    settings: WorkerSettings
    checkpoint_key: Any
    events: Events
    tracer: Tracer

    @property
    def store(self) -> CheckpointStore:  # pragma: no cover - provided by Worker
        raise NotImplementedError

    @property
    def owner(self) -> str:  # pragma: no cover - provided by Worker
        raise NotImplementedError

    def loop(self, name: str) -> LoopSpec:
        """The tool loop called `name`.

        Raises:
            FlowError: no loop has that name.
        """
        try:
            return self.loops[name]
        except KeyError:
            known = ", ".join(sorted(self.loops)) or "none"
            raise FlowError(f"unknown tool loop {name!r} (registered: {known})") from None

    def _model(self, name: str) -> Model:
        if name not in self._models:
            self._models[name] = self.loop(name).model_factory()
        return self._models[name]

    async def decide_loop(
        self,
        name: str,
        run_id: str,
        approve: bool | Mapping[str, bool],
        note: str | None = None,
        ctx: RunContext | None = None,
        operator: str | None = None,
    ) -> LoopResult:
        """Store the decision on the tool loop `name` paused for approval (see `decide_tool_loop`)."""
        return await decide_tool_loop(
            self.loop(name).registry,
            run_id,
            approve=approve,
            note=note,
            checkpoints=self.store,
            checkpoint_key=self.checkpoint_key,
            ctx=ctx,
            name=name,
            lease_s=self.settings.lease_s,
            owner=self.owner,
            operator=operator,
        )

    def loop_stage(
        self, name: str, run_id: str, step: int, *, handoff: bool, cause: str, spend: str | None
    ) -> Coroutine[Any, Any, LoopResult]:
        """One stage of the loop `name` (the first after its wait, for a ``wake`` message)."""
        if cause == "wake":  # a waiting tool's time came (the sweep found it due)
            return wake_tool_loop(
                self._model(name),
                self.loop(name).registry,
                run_id,
                checkpoints=self.store,
                checkpoint_key=self.checkpoint_key,
                name=name,
                events=self.events,
                lease_s=self.settings.lease_s,
                owner=self.owner,
                max_stages=1,
            )
        return advance_tool_loop(
            self._model(name),
            self.loop(name).registry,
            run_id,
            checkpoints=self.store,
            checkpoint_key=self.checkpoint_key,
            expected_step=step,
            handoff=handoff,
            name=name,
            events=self.events,
            lease_s=self.settings.lease_s,
            owner=self.owner,
            park=True,
            spend=spend,
            tracer=self.tracer,
        )
