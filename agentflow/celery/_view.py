"""`RunView`: a distributed run as `FlowClient.status` reads it from the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from agentflow._run_types import DEFAULT_VERSION
from agentflow.exec import ApprovalRequest
from agentflow.exec.run.view import CallView, SegmentView


@dataclass
class RunView:
    """A run as its latest checkpoint shows it."""

    run_id: str
    flow: str
    status: str
    """``running``, ``paused``, ``done``, ``failed`` or ``cancelled``."""
    step: int
    state: BaseModel | dict[str, Any]
    """The state at the latest checkpoint, validated against its flow version's model (the stored JSON
    when the client's app lacks that version: see `needs_migration`)."""
    pending: list[ApprovalRequest] = field(default_factory=list)
    error: str | None = None
    waiting_for_decision: str | None = None
    """Why the run waits for an operator (calls in doubt), or None."""
    running_on: str | None = None
    """The worker that holds the run's lease right now (``<node>:<pid>``), or None."""
    segments: list[SegmentView] = field(default_factory=list)
    """Who held the run when, and who decided each claim (`SegmentView.owner`, `.operator`)."""
    version: str = DEFAULT_VERSION
    """The version of the flow the run is on."""
    needs_migration: bool = False
    """The client's app lacks the run's version (then `state` is the stored JSON, a dict): a worker
    with that version can carry it on, else `FlowClient.migrate` moves it to one that is deployed."""
    in_doubt: list[CallView] = field(default_factory=list)
    """The calls in doubt, each with its id, tool, arguments and the worker it started on: what a
    decision (`FlowClient.decide_in_doubt`, per call id) is made of."""

    @property
    def settled(self) -> bool:
        """Whether the run stopped moving on its own (ended, paused, or waiting for a decision)."""
        return self.status in ("done", "failed", "cancelled", "paused") or self.waiting_for_decision is not None
