"""How often recover_all sends a recovery for a run that stays untouched: once, then with a back-off.

A run whose next message waits in a backlogged queue looks stranded to recover_all: its
latest checkpoint is ``running``, older than ``stale_after_s``, and nobody holds it. Nothing
in the store says a message is on its way, so every sweep would send it another recover
message, behind the same backlog: one more message per queued run per beat period, each a
task for a worker to take (it finds the run moved on, or claims it once). Under a long
backlog those duplicates outgrow the work itself (a recovery storm).

So recover_all leaves a marker for each recovery it sends: the signed marker
``recovering/<run_id>`` (`agentflow.exec.run.markers`), which says the step the run was at and
the rung of the back-off. The run at
that same step is sent another recovery only once the rung's wait has passed: `base_s`, then
twice that, and so on up to `CAP_FACTOR` times `base_s`, each less half a base (so the beat
tick that ends a wait is not missed by the moment the marking took). With the defaults (a
60 s beat) a backlogged run is sent a recovery at the first tick that finds it, then after 1,
2, 4 and 8 ticks, then every 8 ticks. Any save moves the run to another step (it moved, or a
recovering worker claimed it and then died), which makes it a new case, sent at once. So a
stranded run waits longer than before only when the recovery sent for it was lost before any
worker claimed the run (its worker died holding the message) and no worker starts: it gets
the next one after the rung's wait, one beat interval at first.

A worker's start is the exception: its sweep sends a recovery for every stranded run, marked
or not (and marks it, one rung up). A recovery is a message that the worker which took it
holds unacknowledged until a pool process starts it; if that worker dies first, the broker
hands it out again only after its visibility timeout (an hour), while the marker says a
recovery is on its way. A start comes after a worker died more often than not, so, as with
rechecks (`_rechecks`), it does not trust the marker: one message per stranded run per start.

- The marker lives in the store, so it holds whichever worker beat's next tick lands on.
- It lasts twice its wait, so the sweep after the wait still reads its rung and doubles it;
  a marker nobody looked at lapses on its own (a run that finished leaves nothing live; a
  SQL store keeps the lapsed row until the key is put again).
- It is signed: one written by hand does not count (it is removed when read), so it cannot
  hold a recovery back.
- recover_all sends first and marks after: a send that fails leaves no marker, so the next
  sweep tries again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from agentflow.celery._settings import WorkerSettings
from agentflow.celery._stranded import Stranded
from agentflow.exec.run.markers import Markers, Note

#: The back-off grows to this many times its base, then stays there.
CAP_FACTOR: Final = 8
#: The markers' kind (``recovering/<run_id>``).
RECOVERING: Final = "recovering"


def base_of(settings: WorkerSettings) -> float:
    """The back-off's first wait: the beat period, or ``stale_after_s`` if longer."""
    return max(settings.stale_after_s, settings.recover_interval_s or 0.0)


def longest_s(base_s: float) -> float:
    """The longest a recovery marker lasts with the first wait `base_s`: twice the capped wait."""
    return 2 * base_s * CAP_FACTOR


@dataclass(frozen=True)
class Sent:
    """A recovery marker as read back: the step it was sent for and the back-off's rung."""

    step: int
    rung: int
    note: Note


def _read(note: Note) -> Sent | None:
    """The marker `note` as `Sent`, or None if it does not say a step and a rung."""
    step, rung = note.body.get("step"), note.body.get("rung")
    if not isinstance(step, int) or not isinstance(rung, int) or not 0 <= rung < 32:
        return None
    return Sent(step, rung, note)


@dataclass(frozen=True)
class Resends:
    """The recovery markers of one worker's store: which stranded runs to send a recovery now."""

    markers: Markers
    base_s: float
    """The first wait (the beat period, or ``stale_after_s`` if longer)."""
    owner: str
    """Who sets the markers (the worker's lease name)."""

    def wait_s(self, rung: int) -> float:
        """How long a run stays held back after the recovery of `rung` (0 for the first)."""
        return self.base_s * min(1 << rung, CAP_FACTOR)

    async def read(self, run_ids: Sequence[str]) -> Mapping[str, Note]:
        """The markers that count among `run_ids`, by run id."""
        return await self.markers.peek(RECOVERING, run_ids)

    def due(self, mark: Note | None, step: int, now: float) -> bool:
        """Whether a run at `step`, whose marker is `mark`, is sent a recovery at `now`."""
        sent = None if mark is None else _read(mark)
        if sent is None or sent.step != step:
            return True
        # Half a base early: the beat tick one wait after the send is never missed by the milliseconds the marking took.
        return now >= sent.note.at + self.wait_s(sent.rung) - self.base_s / 2

    async def hold_back(self, found: Stranded, now: float, startup: bool = False) -> None:
        """Move the runs of `found.recover` that are not due to `found.held_back`; note the others' markers.

        On a worker's `startup` every run is due (see the module docstring).
        """
        marks = await self.read([run_id for _, run_id, _, _ in found.recover])
        due = []
        for entry in found.recover:
            flow, run_id, step, _ = entry
            if startup or self.due(marks.get(run_id), step, now):
                due.append(entry)
                found.marks[run_id] = marks.get(run_id)
            else:
                found.held_back.append((flow, run_id))
        found.recover = due

    async def mark(self, run_id: str, step: int, mark: Note | None) -> None:
        """Note a recovery just sent for `run_id` at `step`; `mark` is the live marker it replaces, if any."""
        sent = None if mark is None else _read(mark)
        rung = sent.rung + 1 if sent is not None and sent.step == step else 0
        if mark is not None:
            await self.markers.take(mark)
        body = {"step": step, "rung": rung, "owner": self.owner}
        await self.markers.put(RECOVERING, run_id, body, 2 * self.wait_s(rung))
