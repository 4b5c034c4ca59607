"""What a recover_all found: runs to move (`Stranded`), and the runs that wait for a person (`Waiting`).

Every unfinished run's age (from the ``started`` its checkpoints carry) is reported too, so
an alert can find a run older than its flow should ever take.

A run waits for a decision when it is paused for an approval (``approval``: its latest
checkpoint is ``paused``), parked on calls in doubt (``in_doubt``: a signed ``parked``
claim), or on a flow version the sweeping worker lacks (``migration``). recover_all reads
every unfinished run's latest checkpoint anyway, so it counts them on the way and reports
the figures in one ``runs.swept`` event; a metrics exporter turns that into gauges. No
other process can know them without reading the store: a run paused by one worker is
resumed from another process, so counting events would drift.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentflow.exec.run.markers import Note


@dataclass
class Stranded:
    """What a recover_all found: runs to recover now, and runs to look at when their leases end."""

    recover: list[tuple[str, str, int, str]] = field(default_factory=list)
    """``(flow, run_id, step, version)`` of each run nobody holds that should move and does not (a
    tool loop's version is the default one: its messages go to the deployment's queue)."""
    recheck: list[tuple[str, str, int, float]] = field(default_factory=list)
    """``(flow, run_id, step, lease end)`` of each run someone holds (found on a worker's start)."""
    later: list[tuple[str, str, int, str, float]] = field(default_factory=list)
    """``(flow, run_id, step, version, when)`` of each running run nobody holds, saved less than
    ``stale_after_s`` ago (found on a worker's start): its next message may have died with a worker
    that had taken it, so a recovery is sent for `when`, the moment it counts as stranded."""
    quarantined: list[tuple[str, str]] = field(default_factory=list)
    """``(flow, run_id)`` of each run whose latest checkpoint fails its check, reported this time (once)."""
    unknown: list[tuple[str, str]] = field(default_factory=list)
    """``(flow, run_id)`` of each stranded run of a flow the app does not know, reported this time (once)."""
    wake: list[tuple[str, str, int, str]] = field(default_factory=list)
    """``(flow, run_id, step, version)`` of each paused run whose signed timer is due."""
    migrate: list[tuple[str, str, str]] = field(default_factory=list)
    """``(flow, run_id, version)`` of each unfinished run on a flow version this worker's app lacks."""
    held_back: list[tuple[str, str]] = field(default_factory=list)
    """``(flow, run_id)`` of each stranded run not sent a recovery this time: one went out for the
    same step less than a back-off ago (its message may wait in a backlogged queue; `_resends`)."""
    marks: dict[str, Note | None] = field(default_factory=dict)
    """run_id -> the live recovery marker of each run in `recover` (None: it had none), replaced once it is sent."""

    def as_result(self) -> dict[str, Any]:
        """The recover_all task's result: the run ids enqueued and rechecked, and (when any) reported now, by flow."""
        result: dict[str, Any] = {
            "enqueued": [r for _, r, _, _ in self.recover],
            "rechecks": [r for _, r, _, _ in self.recheck],
        }
        if self.wake:
            result["woken"] = [r for _, r, _, _ in self.wake]
        if self.later:
            result["later"] = [r for _, r, _, _, _ in self.later]
        reported = {
            "quarantined": self.quarantined,
            "unknown_flows": self.unknown,
            "needs_migration": [(f"{flow} version {version}", run_id) for flow, run_id, version in self.migrate],
            "held_back": self.held_back,
        }
        return result | {key: {run_id: flow for flow, run_id in runs} for key, runs in reported.items() if runs}


#: Why a run waits: for an approval, for an operator's word on calls in doubt, or for a
#: migration (its flow version is not in the sweeping worker's app).
WHY = ("approval", "in_doubt", "migration")


@dataclass
class Waiting:
    """Runs waiting for a decision, as one sweep found them."""

    now: float
    """When the sweep started (seconds since the epoch)."""
    since: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    """``(flow, why)`` -> when each such run's waiting checkpoint was saved."""

    started: dict[str, list[float]] = field(default_factory=dict)
    """flow -> when each of its unfinished runs started (runs saved before ``started`` existed are left out)."""

    def add(self, flow: str, why: str, saved_at: float) -> None:
        """Note one run of `flow` waiting for `why` since its checkpoint of `saved_at`."""
        self.since.setdefault((flow, why), []).append(saved_at)

    def unfinished(self, flow: str, started_at: float | None) -> None:
        """Note one unfinished run of `flow` (running or paused, held or not) that started at `started_at`."""
        self.started.setdefault(flow, []).extend([] if started_at is None else [started_at])

    def ages(self, flows: Iterable[str]) -> list[dict[str, Any]]:
        """One entry per flow (zeros included): ``flow``, ``runs`` (with a known start), ``oldest_s``."""
        out = []
        for flow in flows:
            started = self.started.get(flow, [])
            oldest = max(0.0, self.now - min(started)) if started else 0.0
            out.append({"flow": flow, "runs": len(started), "oldest_s": round(oldest, 3)})
        return out

    def report(self, flows: Iterable[str]) -> list[dict[str, Any]]:
        """One entry per flow and reason (zeros included): ``flow``, ``why``, ``runs``, ``oldest_s``."""
        out = []
        for flow in flows:
            for why in WHY:
                since = self.since.get((flow, why), [])
                oldest = max(0.0, self.now - min(since)) if since else 0.0
                out.append({"flow": flow, "why": why, "runs": len(since), "oldest_s": round(oldest, 3)})
        return out
