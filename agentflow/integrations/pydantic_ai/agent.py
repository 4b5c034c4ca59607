"""`DurableAgent`: a pydantic-ai agent whose runs survive the death of the process running them."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from pydantic_ai.agent import AbstractAgent
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import UsageLimits

from agentflow._events import Events
from agentflow.exec import Executor, Registry
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.keys import sealer_for
from agentflow.exec.run.lease import DEFAULT_LEASE_S, Ownership
from agentflow.exec.run.protocol import MAX_CHECKPOINT_BYTES
from agentflow.exec.tracing import Tracer
from agentflow.integrations.pydantic_ai._deps import AgentInput, check_factory
from agentflow.integrations.pydantic_ai._driver import AgentDriver
from agentflow.integrations.pydantic_ai._tools import AgentTools
from agentflow.integrations.pydantic_ai.runner import AgentRunner

if TYPE_CHECKING:
    from agentflow.flow import FlowRunner

__all__ = ["DurableAgent"]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


class DurableAgent:
    """A pydantic-ai agent made durable: its model requests and tool calls go through agentflow's call log.

    ``DurableAgent(agent, name="support", idempotent={"lookup_order"})``. Each model request
    and each round of tool calls ends with a signed checkpoint; a tool call is logged
    ``started`` before it runs and with its result after. After a crash, a recovery replays
    what finished, makes a cut-off model request again, reruns a cut-off call of an
    idempotent tool, and parks the run for a decision on a cut-off call of any other tool:
    it is never run again on its own.

    Register it beside flows with ``FlowApp(registry, flows, loops={"support": durable})``;
    its runs are stored as the tool loop ``loop:support``, so workers, the sweep, the CLI,
    the viewer and `FlowClient` act on them as on any run.
    """

    def __init__(
        self,
        agent: AbstractAgent[Any, Any],
        *,
        name: str | None = None,
        idempotent: Collection[str] = (),
        approval: Collection[str] = (),
        deps: Callable[[AgentInput], Any] | None = None,
        usage_limits: UsageLimits | None = None,
        max_requests: int = 50,
        stream: bool = False,
    ) -> None:
        """Wrap `agent`.

        Args:
            agent: the pydantic-ai agent (its model, tools, output type and instructions).
            name: what its runs are stored under (default: the agent's own name).
            idempotent: the tools safe to run again when a crash cut them off (a tool whose
                pydantic-ai metadata says ``{"idempotent": True}`` is too); every other tool's
                cut-off call waits for a decision.
            approval: the tools whose every call waits for a person's signed approval
                (the run pauses; `AgentRunner.resume` decides).
            deps: rebuilds the run's `deps` on whichever worker runs a stage, from the run id
                and the run's `deps_data` (JSON given when it starts). None: no deps.
            usage_limits: pydantic-ai's limits, applied to the usage of the whole run.
            max_requests: the most model requests a run may make, crashes included.
            stream: make each model request streamed and report its text as it comes, in
                ``model.text`` events (loop, turn, text) a page follows through the run's event
                stream (`FlowClient.events`, the viewer); the model must support streaming.

        Raises:
            ValueError: no usable name, `max_requests` below 1, a tool named in `idempotent`
                or `approval` that the agent does not have, or no `deps` for an agent that
                declares a ``deps_type``.
            TypeError: `deps` is not a factory of one argument (the deps themselves, say).
        """
        chosen = name if name is not None else agent.name
        if not chosen or not isinstance(chosen, str) or not _NAME.fullmatch(chosen):
            raise ValueError(
                f"a durable agent needs a name of letters, digits, '_', '.' or '-' (got {chosen!r}): "
                "DurableAgent(agent, name='support'); its runs are stored under it"
            )
        if max_requests < 1:
            raise ValueError(f"max_requests must be at least 1, not {max_requests}")
        toolsets = list(agent.toolsets)
        self.agent, self.name = agent, chosen
        self.tools = AgentTools(toolsets, idempotent, approval)
        if all(isinstance(t, FunctionToolset) for t in toolsets):  # every tool is known: check the names
            known = {tool.name for tool in self.tools.registry}
            unknown = sorted((set(idempotent) | set(approval)) - known)
            if unknown:
                raise ValueError(f"agent {chosen!r} has no tool {unknown} (its tools: {sorted(known)})")
        check_factory(agent, chosen, deps)
        self.deps, self.usage_limits, self.max_requests, self.stream = deps, usage_limits, max_requests, stream

    def __repr__(self) -> str:
        return f"DurableAgent({self.name!r}, tools={sorted(t.name for t in self.tools.registry)})"

    @property
    def registry(self) -> Registry:
        """The agent's tools as agentflow knows them (idempotent or not).

        Tools from toolsets known only at run time (an MCP server's) join it when first called.
        """
        return self.tools.registry

    def runner(
        self,
        checkpoints: CheckpointStore | None = None,
        checkpoint_key: bytes | Sequence[bytes] | None = None,
        *,
        events: Events | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        owner: str | None = None,
        identity: str | None = None,
        tracer: Tracer | None = None,
        max_checkpoint_bytes: int = MAX_CHECKPOINT_BYTES,
    ) -> AgentRunner:
        """A runner for this agent's runs in this process (the arguments are `LoopRunner`'s).

        Raises:
            ValueError, TypeError: a missing or short key, a `lease_s` that is not positive,
                or both `owner` and `identity`.
        """
        if max_checkpoint_bytes < 1024:
            raise ValueError(f"max_checkpoint_bytes must be at least 1024, not {max_checkpoint_bytes}")
        executor = Executor(self.tools.registry, events=events, tracer=tracer)
        return self._runner(
            self.name,
            executor,
            checkpoints,
            sealer_for(checkpoints, checkpoint_key),
            Ownership.chosen(owner, identity, lease_s),
            max_checkpoint_bytes,
        )

    def runner_beside(self, runner: FlowRunner, name: str) -> AgentRunner:
        """The runner of this agent's runs stored as loop `name`, sharing `runner`'s store, keys, hold and hub."""
        executor = Executor(self.tools.registry, events=runner.events, tracer=runner.executor.tracer)
        return self._runner(
            name, executor, runner.checkpoints, runner.sealer, runner.ownership, runner.max_checkpoint_bytes
        )

    def _runner(
        self,
        name: str,
        executor: Executor,
        checkpoints: CheckpointStore | None,
        sealer: Any,
        ownership: Ownership,
        max_checkpoint_bytes: int,
    ) -> AgentRunner:
        driver = AgentDriver(
            self.agent, self.tools, executor, name, deps=self.deps, usage_limits=self.usage_limits, stream=self.stream
        )
        return AgentRunner(driver, executor, checkpoints, sealer, ownership, max_checkpoint_bytes, self.max_requests)
