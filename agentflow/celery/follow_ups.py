"""The messages a task sends when its work is done: the one rule, for the Celery tasks and the simulation.

- After a superstep (`after_superstep`): a run found held is looked at again once its lease
  ends (a ``recheck``, sent to arrive `recheck_margin_s` after it); a run that goes on gets
  its next superstep (``next``), on its flow version's queue.
- After a superstep that ended a child run (`after_child`): a ``wake`` for its parent, when
  the parent still waits for its children (else the sweep finds it, later).
- After a sweep (`after_sweep`): a ``recover`` for every stranded run, a ``recheck`` for
  every held one (on a worker's start), a ``wake`` for every paused run whose timer is due.

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
    lease_ends: float | None = None
    """A recheck: when the lease it waits for ends (seconds since the epoch); None: send at once."""

    def countdown(self, now: float, margin_s: float) -> float | None:
        """Seconds to hold the message back: until `margin_s` after the lease ends (None: none)."""
        if self.lease_ends is None:
            return None
        return max(0.0, self.lease_ends - now) + margin_s


def after_superstep(outcome: Outcome, flow: str, run_id: str, step: int) -> list[FollowUp]:
    """What a superstep task sends after `outcome` (held: a recheck; goes on: the next superstep)."""
    sent = []
    if outcome.held_until is not None:
        sent.append(FollowUp(flow, run_id, step, "recheck", lease_ends=outcome.held_until))
    if outcome.next_step is not None:
        sent.append(FollowUp(flow, run_id, outcome.next_step, "next", version=outcome.version))
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
    sent += [FollowUp(flow, run_id, step, "recheck", lease_ends=ends) for flow, run_id, step, ends in found.recheck]
    sent += [FollowUp(flow, run_id, step, "wake", version=version) for flow, run_id, step, version in found.wake]
    return sent
