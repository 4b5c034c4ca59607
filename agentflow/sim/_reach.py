"""Reach: what each episode draws so that the orders a bug needs come up often, not once in a million steps.

Moving parts:
- `Reach`: how an episode's profile is drawn (`Config.reach`; None runs every episode with
  the configured rates, no favoured points and the full length: what a regression seed pins).
- `Profile`: one episode's draw, from the episode's own generator (so a seed replays it):
  - *swarm testing*: each fault kind is off entirely in some episodes, and its rate is the
    configured one scaled by a factor drawn per episode, so that an episode may be all
    stalls and no crashes, or lose no message at all (a fault that hides another never
    fires alongside it there);
  - *favoured points* (buggify): a worker about to go on from a point between a read and
    the write that read justifies (`between_read_and_write`) is stalled or crashed right
    there with the episode's `Profile.hot` chance, far above the background rate; a stall
    right before a write lasts past the worker's lease (`Profile.long`), so its write is late;
  - *a crash at a tool* (`Profile.tool_crash`): a worker at a tool's start (its ``started``
    stored) or return (its effect had, its ``done`` not yet written) is crashed there, the
    call left in doubt for recovery, with a chance drawn per episode;
  - *a stall cut short before a write* (`Profile.cut`): when a worker's write of a run's rows
    (a checkpoint, a call record) is about to take effect, a worker stalled before a write of
    its own (say a ``started`` it read the log for before its lease lapsed) wakes first and
    writes: its stall lasted exactly until then, so the late write lands between another
    worker's read and the write that read justifies (a claim, a record at the position it
    counted);
  - *an echo of a crashed worker's message* (`Profile.echo`): a superstep message whose
    worker crashed inside the step comes back once more unflagged (its publisher's retry,
    late: the doubled fault's twin), due right after the dead worker's lease lapsed (or a
    worker stalled for longer than a lease: its twin, while it stands still), so a
    clean handoff meets the records the dead worker wrote past its checkpoint;
  - *shorter episodes*: the steps an episode runs with faults are drawn per episode, so
    that more episodes (more starts, handoffs and first recoveries) fit in a budget.

Invariants: a profile draws only from the episode's generator, before any actor runs; with
`Config.reach` None nothing is drawn, so the schedules of the plain simulation stay as they were.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from agentflow.sim._broker import MessageFaults

if TYPE_CHECKING:
    from agentflow.sim._simulation import Faults

#: The store operations that write (their point before is where a stale read is acted on).
WRITES = frozenset(
    {
        "save",
        "save_after_calls",
        "save_moving",
        "record_call",
        "put_marker",
        "take_marker",
        "append_events",
        "release_lease",
        "relist",
        "delete",
        "take_lease",
        "take_lease_reading_head",
        "renew_lease",
    }
)


def between_read_and_write(point: str) -> bool:
    """Whether a worker parked at `point` stands between a read and the write it justifies.

    Those are the point after any store operation returned (the worker now acts on what it
    read, or on the write it made: a head, the log, a lease's take, a ``started``), the point
    before a write takes effect (the write that acts on it), and a tool's start and return
    (its effect is had between them; its ``done`` is written after it returned).
    """
    if point.startswith("tool."):
        return True
    if not point.startswith("store."):
        return False
    return point.endswith(".returned") or before_write(point)


def before_write(point: str) -> bool:
    """Whether `point` is the point before a store write takes effect."""
    parts = point.split(".")  # store.<operation>[.<record kind>][.returned]
    return parts[0] == "store" and len(parts) > 1 and parts[1] in WRITES and parts[-1] != "returned"


@dataclass(frozen=True)
class Reach:
    """How each episode's `Profile` is drawn."""

    off: float = 0.3
    """Chance that a fault kind is off for the whole episode."""
    scale: tuple[float, float] = (-2.0, 3.0)
    """A kind that is on has its configured rate times 2 to a power drawn uniformly from this range."""
    hot: tuple[float, float] = (0.0, 0.08)
    """The chance, drawn per episode from this range, that a worker is stalled or crashed at a favoured point."""
    hot_crash: float = 0.25
    """Of the faults at favoured points, the share that are crashes (the rest are stalls)."""
    stall: tuple[float, float] = (0.2, 4.0)
    """A stall lasts this many leases, drawn per stall: a short one reorders workers without losing a lease, a long
    one outlasts the sweep's recovery of the run (a claim), unless `Profile.cut` ends it right before a write."""
    length: tuple[float, float] = (0.25, 1.0)
    """An episode runs with faults for this fraction of `Config.episode_steps`, drawn per episode."""
    long: tuple[float, float] = (2.0, 6.0)
    """A stall at a favoured point right before a write lasts this many leases: the write comes after the lease lapsed
    (and, as often as not, after another worker claimed the run or wrote where this one counted)."""
    tool_crash: tuple[float, float] = (0.0, 0.3)
    """The chance, drawn per episode from this range, that a worker at a tool's start or return is crashed there."""
    cut: tuple[float, float] = (0.3, 1.0)
    """The chance, drawn per episode, that a stalled worker before a write wakes right before another worker's write."""
    echo: tuple[float, float] = (0.0, 1.0)
    """The chance, drawn per episode, that a crashed worker's message comes back unflagged (`Profile.echo`)."""
    echo_after: tuple[float, float] = (1.0, 1.6)
    """The echo is due this many leases after the crash: once the dead worker's lease lapsed."""


@dataclass(frozen=True)
class Profile:
    """One episode's draw (see the module docstring)."""

    faults: Faults
    hot: float = 0.0
    hot_crash: float = 0.0
    stall: tuple[float, float] = (1.1, 2.5)
    steps: int = 0
    off: tuple[str, ...] = field(default=())
    tool_crash: float = 0.0
    cut: float = 0.0
    echo: float = 0.0
    echo_after: tuple[float, float] = (1.0, 1.6)
    long: tuple[float, float] = (2.0, 6.0)

    def __str__(self) -> str:
        return (
            f"{self.steps} steps with faults, favoured points {self.hot:.3f}, crash at a tool {self.tool_crash:.3f}, "
            f"stalls cut before a write {self.cut:.3f}, echoes {self.echo:.3f}, off: {', '.join(self.off) or 'none'}"
        )


#: The fault kinds a profile may scale or turn off, by their field in `Faults` (and `MessageFaults`).
KINDS = ("crash", "stall", "store_before", "store_after", "tamper")
MESSAGE_KINDS = ("lost", "doubled", "late")


def draw(reach: Reach, faults: Faults, episode_steps: int, rng: random.Random) -> Profile:
    """Draw one episode's profile from `rng` (the episode's generator)."""
    off: list[str] = []

    def rate(name: str, base: float) -> float:
        gone, power = rng.random() < reach.off, rng.uniform(*reach.scale)
        if gone:
            off.append(name)
            return 0.0
        scaled: float = base * 2.0**power
        return min(scaled, 0.5)

    rates = {name: rate(name, getattr(faults, name)) for name in KINDS}
    messages = MessageFaults(
        **{name: rate(f"message-{name}", getattr(faults.messages, name)) for name in MESSAGE_KINDS}
    )
    hot = rng.uniform(*reach.hot)
    steps = int(episode_steps * rng.uniform(*reach.length))
    tool_crash, cut, echo = rng.uniform(*reach.tool_crash), rng.uniform(*reach.cut), rng.uniform(*reach.echo)
    faults = replace(faults, messages=messages, **rates)
    return Profile(
        faults, hot, reach.hot_crash, reach.stall, max(steps, 1), tuple(off), tool_crash, cut, echo, reach.echo_after,
        reach.long,
    )  # fmt: skip
