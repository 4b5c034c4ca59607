"""The messages a task sends when its work is done: the one rule, for the Celery tasks and the simulation.

- After a superstep (`after_superstep`): a run found held is looked at again once its lease
  ends (a ``recheck``, sent to arrive `recheck_margin_s` after it); a run that goes on gets
  its next superstep (``next``), on its flow version's queue; a run that a message sent
  after a worker may have died (a recheck, a delivery again) found moved on, at rest and
  held by nobody gets a ``recover`` for when it counts as stranded (`Outcome.stranded_at`):
  the worker that moved it may have died before it sent the next message.
- After a superstep that ended a child run (`after_child`): a ``wake`` for its parent, when
  the parent still waits for its children (else the sweep finds it, later).
- After a sweep (`after_sweep`): a ``recover`` for every stranded run, a ``recheck`` for
  every held one (on a worker's start), a ``wake`` for every paused run whose timer is due,
  and (on a worker's start) a ``recover`` for when it counts as stranded for every run at
  rest that nobody holds and that was saved too recently to count yet (`Stranded.later`).

What the sender does with a `FollowUp` (a Celery message with a countdown, a simulated
broker's queue) is its own business; what to send is decided here, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentflow.exec.checkpoints.records import ENDED

if TYPE_CHECKING:
    from agentflow.celery._stranded import Stranded
    from agentflow.celery.worker import Outcome, Worker


@dataclass(frozen=True)
class FollowUp:
    """One superstep message to send: `cause` for `run_id` at `step`."""

    flow: str
    run_id: str
    step: int
    cause: str
    version: str | None = None
    """The run's flow version (its queue); None: the deployment's queue."""
    due: float | None = None
    """When the message is due, less the margin (seconds since the epoch): a recheck's lease end, or
    when a run at rest counts as stranded; None: send at once."""

    def countdown(self, now: float, margin_s: float) -> float | None:
        """Seconds to hold the message back: until `margin_s` after it is `due` (None: none)."""
        if self.due is None:
            return None
        return max(0.0, self.due - now) + margin_s


def after_superstep(outcome: Outcome, flow: str, run_id: str, step: int) -> list[FollowUp]:
    """What a superstep task sends after `outcome` (held: a recheck; goes on: the next one; at rest: a recover)."""
    sent = []
    if outcome.held_until is not None:
        sent.append(FollowUp(flow, run_id, step, "recheck", due=outcome.held_until))
    if outcome.next_step is not None:
        sent.append(FollowUp(flow, run_id, outcome.next_step, "next", version=outcome.version))
    if outcome.stranded_at is not None and outcome.step is not None:
        sent.append(FollowUp(flow, run_id, outcome.step, "recover", outcome.version, due=outcome.stranded_at))
    return sent


async def after_child(worker: Worker, outcome: Outcome) -> list[FollowUp]:
    """What a superstep task sends after `outcome` ended a child run: its parent's ``wake``, if the parent waits."""
    if outcome.parent is None or outcome.status not in ENDED:
        return []
    waiting = await worker.parent_waiting(outcome.parent)
    if waiting is None:
        return []
    flow, step, version = waiting
    return [FollowUp(flow, outcome.parent, step, "wake", version=version)]


def after_sweep(found: Stranded) -> list[FollowUp]:
    """What the recover_all task sends for what its sweep `found`."""
    sent = [FollowUp(flow, run_id, step, "recover", version=version) for flow, run_id, step, version in found.recover]
    sent += [FollowUp(flow, run_id, step, "recheck", due=ends) for flow, run_id, step, ends in found.recheck]
    sent += [FollowUp(flow, run_id, step, "wake", version=version) for flow, run_id, step, version in found.wake]
    sent += [FollowUp(flow, run_id, step, "recover", version, due) for flow, run_id, step, version, due in found.later]
    return sent
