"""`AgentRunner`: the durable runs of one pydantic-ai agent (built by `DurableAgent.runner`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentflow._errors import CheckpointConflict
from agentflow._identity import RunContext, identity_body
from agentflow._run_types import RunStatus
from agentflow.exec import Executor
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.driven import ProtocolRunner
from agentflow.exec.run.lease import Ownership
from agentflow.exec.run.protocol import RunProtocol
from agentflow.exec.seal import Sealer, canonical
from agentflow.integrations.pydantic_ai._deps import check_start
from agentflow.integrations.pydantic_ai._driver import AgentCursor, AgentDriver, AgentResult

__all__ = ["AgentRunner"]


class AgentRunner(ProtocolRunner[AgentCursor, AgentResult]):
    """Runs one durable agent; every run survives the death of its worker (with a checkpoint store).

    The operations on stored runs (advance, recover, resume, wake, decide_in_doubt, cancel,
    retry, fork, read) are `DrivenRunner`'s; migrate is refused with the reason (`AgentDriver.refused`).
    """

    def __init__(
        self,
        driver: AgentDriver,
        executor: Executor,
        checkpoints: CheckpointStore | None,
        sealer: Sealer | None,
        ownership: Ownership,
        max_checkpoint_bytes: int,
        max_requests: int,
    ) -> None:
        """Use `DurableAgent.runner` (or `FlowApp(loops=...)`) to build one."""
        self.name = driver.name
        self.checkpoints, self.sealer, self.ownership = checkpoints, sealer, ownership
        self.executor, self.events = executor, executor.events
        self.max_requests = max_requests
        self.deps = driver.deps
        self.protocol: RunProtocol[AgentCursor, AgentResult] = RunProtocol(
            driver,
            checkpoints,
            sealer,
            executor.registry,
            executor.events,
            max_checkpoint_bytes,
            ownership,
            executor.tracer,
        )

    def _cursor(
        self, prompt: str, run_id: str | None, deps_data: Mapping[str, Any] | None, ctx: RunContext | None
    ) -> AgentCursor:
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("an agent run starts from a prompt: pass a non-empty string")
        rid = run_id if run_id is not None else self.fresh_run_id()
        if not rid or not isinstance(rid, str):
            raise ValueError("run_id must be a non-empty string")
        data = dict(deps_data or {})
        try:
            canonical(data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"deps_data must be JSON (it is signed into the run's step 0): {exc}") from None
        check_start(self.name, self.deps, data)
        return AgentCursor(rid, identity_body(self.sealer, rid, ctx), ctx, prompt, data, self.max_requests)

    async def run(
        self,
        prompt: str | None = None,
        *,
        run_id: str | None = None,
        deps_data: Mapping[str, Any] | None = None,
        ctx: RunContext | None = None,
        approve: bool | Mapping[str, bool] | None = None,
        note: str | None = None,
    ) -> AgentResult:
        """Run the agent on `prompt` until it answers, pauses for an approval, or fails.

        With a store, a checkpoint ends every model request and every round of tools; a tool
        call is logged before and after it runs. Given the `run_id` of a run paused for an
        approval, it resumes that run: `approve` decides the pending calls (None returns it
        as it stands). A run retried with the same `run_id`, `prompt`, `deps_data` and `ctx`
        (its first try raised, `StoreNotDurable` among the errors, or its answer was lost)
        attaches to the run the first try stored (`RunProtocol.begin`): it carries it on as
        `recover` does, or returns it as it stands if it ended or paused.

        Args:
            prompt: the user prompt (not needed to resume).
            run_id: the run's id; unguessable by default.
            deps_data: JSON the `deps` factory gets on every worker (signed in clear: no secrets).
            ctx: who the run acts for.
            approve: the decision when resuming a paused run: one for all, or per call id.
            note: a note stored with the decision.

        Raises:
            CheckpointConflict: the run id belongs to another run, or to one started with another
                prompt, `deps_data` or identity; or, without a `prompt`, to a run that is running
                or ended (`RunHeld`: a live worker carries it on).
            ModelError: the model request failed (the run stays recoverable).
            ValueError: no prompt, `deps_data` that is not JSON, or `deps_data` for an agent
                with no deps factory (it would never be read).
            StoreNotDurable: the store could not confirm step 0 in time: the run may exist and
                goes on if it does; retry with the same `run_id`.
        """
        resuming = prompt is None or approve is not None  # else a start, perhaps retried: `begin` attaches
        if run_id is not None and self.checkpoints is not None and resuming and await self._exists(run_id):
            if approve is None:
                opened = await self.protocol.steps.open(run_id, ctx)
                if opened.status != RunStatus.PAUSED:
                    raise CheckpointConflict(f"run {run_id!r} exists and is {opened.status}, not paused")
                return self.protocol.driver.result(opened.cur, RunStatus.PAUSED)
            return await self.resume(run_id, approve=approve, note=note, ctx=ctx)
        if prompt is None:
            raise ValueError("an agent run starts from a prompt: pass a non-empty string")
        return await self.protocol.begin(self._cursor(prompt, run_id, deps_data, ctx), None)

    async def start(
        self,
        prompt: str,
        *,
        run_id: str | None = None,
        deps_data: Mapping[str, Any] | None = None,
        ctx: RunContext | None = None,
    ) -> AgentResult:
        """Save a new run's step 0 (its prompt) without running it; a worker advances it.

        A start retried with the same `run_id`, `prompt`, `deps_data` and `ctx` returns the run
        its first try stored, as it stands (`RunProtocol.begin`).

        Raises:
            ValueError: the runner has no store, no prompt, `deps_data` that is not JSON, or
                `deps_data` for an agent with no deps factory.
            CheckpointConflict: the run id is taken by another run, or by one started with
                another prompt, `deps_data` or identity.
            StoreNotDurable: the store could not confirm step 0 in time (see `run`).
        """
        if self.checkpoints is None:
            raise ValueError("start needs an AgentRunner with a checkpoint store")
        return await self.protocol.begin(self._cursor(prompt, run_id, deps_data, ctx), 0)
