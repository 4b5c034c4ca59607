"""The history of accepted writes, checked against the stores' rules as each write takes effect.

The stores report every write that took effect, in the order it did (`SimPoints`); the
world hands each one here. A store's fencing, append-only and compare-and-set rules are
what the protocol stands on, and the protocol's other defences (a lease confirmed before a
tool, a claim that counts the log again) often hide a store that broke one of them: no
effect happens twice, yet the store took a write it must refuse. So the history is
checked on its own, as a history checker checks a database's (Jepsen's way): the bug is
named at the write that broke the rule, whatever the protocol made of it afterwards.

Rules checked (`History.call`, `History.checkpoint`):
- a ``started`` record is stored only in the segment of the run's newest checkpoint, and
  only while the run has not ended (a claim fences the segments before its own);
- a record is stored only at the next free position of its segment: never at one that
  holds a record (append-only), never past a gap;
- a checkpoint is stored only at step 0 of a new run or exactly one past the newest, and
  never after a ``done`` or ``cancelled`` one (the compare-and-set).

Not checked once the store lost acknowledged writes (a failover rolls rows back behind the
history's back: what it then accepts is judged against rows the history no longer sees).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentflow.exec.checkpoints.records import ENDED, SealedCall, SealedCheckpoint

#: Statuses after which no checkpoint may follow (a failed run takes a retry's claim).
_FINAL = frozenset({"done", "cancelled"})


@dataclass
class History:
    """What the store accepted so far, per run: its newest checkpoint and how many records each segment holds."""

    #: run -> (step, status, segment) of its newest checkpoint.
    newest: dict[str, tuple[int, str, int]] = field(default_factory=dict)
    #: (run, segment) -> records stored in that segment.
    counts: dict[tuple[str, int], int] = field(default_factory=dict)
    #: (run, call id) -> the segment of the call's newest ``started``.
    started_in: dict[tuple[str, str], int] = field(default_factory=dict)

    def call(self, run_id: str, record: SealedCall, call_id: str | None) -> str | None:
        """A call record was stored: the rule it broke, or None."""
        newest = self.newest.get(run_id)
        position = (run_id, record.segment)
        stored = self.counts.get(position, 0)
        self.counts[position] = max(stored, record.seq + 1)
        if record.kind == "started" and call_id is not None:
            self.started_in[(run_id, call_id)] = record.segment
        where = f"{run_id} record {record.segment}.{record.seq} ({record.kind})"
        if newest is None:
            return f"the store took {where} before the run's step 0"
        step, status, segment = newest
        if record.kind == "started" and status in ENDED:
            return f"the store took {where} after the run ended ({status} at step {step})"
        if record.kind == "started" and record.segment != segment:
            return f"the store took {where} from a segment fenced off by segment {segment} (step {step})"
        if record.seq < stored:
            return f"the store took {where} at a position that holds a record (append-only)"
        if record.seq > stored:
            return f"the store took {where} past a gap (the segment held {stored})"
        return None

    def checkpoint(self, run_id: str, row: SealedCheckpoint) -> str | None:
        """A checkpoint was stored: the rule it broke, or None."""
        newest = self.newest.get(run_id)
        self.newest[run_id] = (row.step, row.status, row.segment)
        where = f"{run_id} checkpoint {row.step} ({row.status}, segment {row.segment})"
        if newest is None:
            return None if row.step == 0 else f"the store took {where} for a run with no step 0"
        step, status, _ = newest
        if status in _FINAL:
            return f"the store took {where} after the run ended ({status} at step {step})"
        if row.step != step + 1:
            return f"the store took {where} over step {step}: not exactly one past (the compare-and-set)"
        return None
