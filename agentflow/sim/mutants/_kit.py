"""The planted bugs: each a small patch of the run protocol or of a store's rules, applied in this process only.

A `Mutant` names one bug and how to plant it on each store set-up it concerns (`Mutant.plant`):
a context manager that patches the code in this process for the ``with`` block and puts it
back after, never a file of the working tree. The stores' rules are planted in each store
where it keeps them: the memory store and SQLite check them in Python (`checkpoints.rules`,
called by the name each store module imported, so that name is patched there), the Redis
store in Lua (the mutant swaps in a patched copy of the script's text, which every store
made inside the block loads, here on fakeredis).

Invariants of the kit:
- A patch that no longer finds the text or the name it patches fails at once (`Unplantable`),
  so a change of the code under it cannot leave a mutant that silently plants nothing.
- Every store mutant plants the same rule on the three store set-ups (memory, SQLite,
  fakeredis); a protocol mutant is the same code on every set-up.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

from agentflow.exec.calls import log as calls_log
from agentflow.exec.checkpoints import memory as memory_store
from agentflow.exec.checkpoints import rules
from agentflow.exec.checkpoints.records import Lease
from agentflow.exec.checkpoints.redis import store as redis_store
from agentflow.exec.checkpoints.sqlite import _leases as sqlite_leases
from agentflow.exec.checkpoints.sqlite import _rows as sqlite_rows
from agentflow.exec.run import protocol as run_protocol
from agentflow.exec.run import steps as run_steps
from agentflow.exec.run.checks import marker_of
from agentflow.exec.run.lease import Tenure

#: The store set-ups a store mutant is planted on.
STORES = ("memory", "sqlite", "fakeredis")

Plant = Callable[[], AbstractContextManager[None]]


class Unplantable(AssertionError):
    """The code a mutant patches changed: the mutant must be written again."""


@dataclass(frozen=True)
class Mutant:
    """One planted bug: its name, what it breaks, and how to plant it per store set-up (None: the same everywhere)."""

    name: str
    breaks: str
    everywhere: Plant | None = None
    per_store: Mapping[str, Plant] = dataclasses.field(default_factory=dict)

    @property
    def of_store(self) -> bool:
        """Whether the bug is in the stores (then it is hunted on each of them), not in the protocol."""
        return bool(self.per_store)

    def setups(self) -> tuple[str, ...]:
        """The set-ups the mutant is hunted on: each store for a store mutant, memory for a protocol one."""
        return tuple(self.per_store) if self.per_store else ("memory",)

    def plant(self, setup: str) -> AbstractContextManager[None]:
        """The patch of this bug on `setup`, for a ``with`` block."""
        if self.everywhere is not None:
            return self.everywhere()
        return self.per_store[setup]()


# -- patching helpers ------------------------------------------------------------------------


def _patches(*patches: tuple[Any, str, Any]) -> Plant:
    """A plant of attribute patches: (owner, name, new value); the name must be there."""

    @contextmanager
    def plant() -> Iterator[None]:
        with ExitStack() as stack:
            for owner, name, value in patches:
                if not hasattr(owner, name):
                    raise Unplantable(f"{owner!r} has no {name!r} any more")
                stack.enter_context(mock.patch.object(owner, name, value))
            yield

    return plant


def _lua(*edits: tuple[str, str, str]) -> Plant:
    """A plant of edits of the Redis store's scripts: (script, text, replacement); the text must be there."""

    @contextmanager
    def plant() -> Iterator[None]:
        patched = dict(redis_store._LUA)
        for script, old, new in edits:
            if old not in patched[script]:
                raise Unplantable(f"{script}.lua no longer holds {old!r}")
            patched[script] = patched[script].replace(old, new)
        with mock.patch.dict(redis_store._LUA, patched):
            yield

    return plant


def _sql(owner: Any, name: str, old: str, new: str) -> Plant:
    """A plant of an edit of one SQL statement a SQLite module keeps (`owner.name`); the text must be there."""
    text = getattr(owner, name, None)
    if not isinstance(text, str) or old not in text:
        raise Unplantable(f"{owner!r}.{name} no longer holds {old!r}")
    return _patches((owner, name, text.replace(old, new)))


def _in_python_stores(name: str, value: Any) -> Plant:
    """A rule of `checkpoints.rules` replaced where the memory and SQLite stores call it."""
    owners = [memory_store, sqlite_leases if name == "check_lease_move" else sqlite_rows]
    return _patches(*((owner, name, value) for owner in owners))


def _both(*plants: Plant) -> Plant:
    @contextmanager
    def plant() -> Iterator[None]:
        with ExitStack() as stack:
            for one in plants:
                stack.enter_context(one())
            yield

    return plant


# -- the store's rules -----------------------------------------------------------------------


def _fenced_started_accepted(run_id: str, record: Any, latest: Any, next_seq: int) -> None:
    if latest is not None and record.kind == "started":
        latest = (latest[0], latest[1], record.segment)  # as if the record's segment were the latest one
    rules.check_call(run_id, record, latest, next_seq)


def _taken_position_accepted(run_id: str, record: Any, latest: Any, next_seq: int) -> None:
    rules.check_call(run_id, record, latest, record.seq if record.seq < next_seq else next_seq)


def _stale_step_accepted(run_id: str, step: int, flow: str, latest: Any) -> None:
    if latest is not None and step <= latest[0]:
        latest = (step - 1, latest[1], latest[2])  # any step up to the next one is taken
    rules.check_save(run_id, step, flow, latest)


async def _take_breaking(self: Any, run_id: str, owner: str, token: str, ttl_s: float) -> Any:
    self._leases.pop(run_id, None)  # whoever held it live: the take writes over it
    return await _MEMORY_TAKE(self, run_id, owner, token, ttl_s)


_MEMORY_TAKE = memory_store.MemoryCheckpointStore.take_lease


async def _renew_stealing(self: Any, run_id: str, token: str, ttl_s: float) -> Any:
    held = self._live(run_id)
    if held is None:
        return None
    self._leases[run_id] = Lease(run_id, held.owner, token, time.time() + ttl_s)  # whoever's token it held
    return self._leases[run_id]


FENCED_STARTED = Mutant(
    "fenced-started",
    "the store accepts a `started` record from a segment a claim fenced off",
    per_store={
        "memory": _in_python_stores("check_call", _fenced_started_accepted),
        "sqlite": _in_python_stores("check_call", _fenced_started_accepted),
        "fakeredis": _lua(
            ("record_call", "(ended or last[3] ~= ARGV[1])", "ended"),
            ("save", "(ended or segment_of_latest ~= segment)", "ended"),
        ),
    },
)

TAKEN_POSITION = Mutant(
    "record-overwrites",
    "a call record at a (segment, number) that holds one already is stored (append-only broken)",
    per_store={
        "memory": _in_python_stores("check_call", _taken_position_accepted),
        "sqlite": _both(
            _in_python_stores("check_call", _taken_position_accepted),
            lambda: _sql(sqlite_rows, "_INSERT_CALL", "INSERT INTO", "INSERT OR REPLACE INTO")(),
        ),
        "fakeredis": _lua(
            (
                "record_call",
                "if fenced or taken or tonumber(ARGV[2]) ~= count then",
                "if fenced or tonumber(ARGV[2]) > count then",
            ),
            (
                "save",
                "if fenced or taken or tonumber(seq) ~= counts[segment] then",
                "if fenced or tonumber(seq) > counts[segment] then",
            ),
        ),  # fmt: skip
    },
)

STALE_STEP = Mutant(
    "save-not-next",
    "a save is stored at a step that is not exactly one past the latest (the compare-and-set broken)",
    per_store={
        "memory": _in_python_stores("check_save", _stale_step_accepted),
        "sqlite": _both(
            _in_python_stores("check_save", _stale_step_accepted),
            lambda: _sql(sqlite_rows, "_INSERT_CHECKPOINT", "INSERT INTO", "INSERT OR REPLACE INTO")(),
        ),
        "fakeredis": _lua(
            ("save", "tonumber(ARGV[1]) ~= tonumber(last[1]) + 1", "tonumber(ARGV[1]) > tonumber(last[1]) + 1"),
            ("save", "if rows ~= tonumber(last[1]) + 1 then", "if false then"),
        ),
    },
)

LEASE_BROKEN = Mutant(
    "lease-take-breaks",
    "a lease take breaks another token's live lease",
    per_store={
        "memory": _patches((memory_store.MemoryCheckpointStore, "take_lease", _take_breaking)),
        "sqlite": lambda: _sql(
            sqlite_leases.LEASES, "_set", " WHERE leases.expires_at <= :now OR leases.token = excluded.token", ""
        )(),
        "fakeredis": _lua(
            (
                "lease",
                "  if live and held[2] ~= token then\n    return {'held', held[1], held[2], held[3]}",
                "  if false then\n    return {'held', held[1], held[2], held[3]}",
            ),
        ),  # fmt: skip
    },
)

RENEW_STEALS = Mutant(
    "renew-steals",
    "a lease renewal takes over another token's live lease",
    per_store={
        "memory": _patches((memory_store.MemoryCheckpointStore, "renew_lease", _renew_stealing)),
        "sqlite": lambda: _sql(
            sqlite_leases,
            "_RENEW",
            "SET expires_at = :now + :ttl WHERE run_id = :run_id AND token = :token",
            "SET expires_at = :now + :ttl, token = :token WHERE run_id = :run_id",
        )(),
        "fakeredis": _lua(
            (
                "lease",
                "  if not live or held[2] ~= token then\n    return {'lost'}",
                "  if not live then\n    return {'lost'}",
            )
        ),
    },
)


# -- the run protocol ------------------------------------------------------------------------


async def _trusting_read(self: Any, cur: Any, counts: Any, claim_step: int, opened: int = 0) -> None:
    return None


async def _sure(self: Any, unclaimed: Any) -> bool:
    return True


def _past_unread(body: Mapping[str, Any], counts: Mapping[int, int]) -> int | None:
    mark = marker_of(body)
    if mark is None:
        return None
    segment, count = mark
    if any(s > segment and n for s, n in counts.items()):
        return None
    return max(count, counts.get(segment, 0))  # goes on after records it never read


def _every_doubt_granted(body: Mapping[str, Any], segment: int, states: Mapping[str, Any]) -> set[str]:
    if "claim" not in body:
        return set()
    return {cid for cid, state in states.items() if getattr(state, "in_doubt", False)}


def _no_doubt(run_id: str, states: Any, registry: Any, allowed: Any) -> None:
    return None


def _took_back_unclaimed(self: Any) -> Any:
    async def yes() -> bool:
        return True

    return yes()


CLAIM_TRUSTS_READ = Mutant(
    "claim-trusts-read",
    "a claim does not read the log again once it fenced the old segment (`RunSteps._read_still_whole`)",
    everywhere=_patches((run_steps.RunSteps, "_read_still_whole", _trusting_read)),
)

DONE_NOT_FINAL = Mutant(
    "done-not-final",
    "a call with its `done` stored is not replayed but run again",
    everywhere=_patches((calls_log, "FINAL", frozenset({"failed", "denied"}))),
)

LEASE_UNCONFIRMED = Mutant(
    "lease-unconfirmed",
    "a tool runs without its worker confirming its lease right before it (`Tenure.confirm`)",
    everywhere=_patches((Tenure, "confirm", _sure)),
)

TAKE_BACK_CLAIMED = Mutant(
    "take-back-claimed",
    "a worker that takes its lapsed lease back does not look for a claim since (`CallLog._unclaimed`)",
    everywhere=_patches((calls_log.CallLog, "_unclaimed", _took_back_unclaimed)),
)

HANDOFF_PAST_UNREAD = Mutant(
    "handoff-past-unread",
    "a handoff goes on in the writer's segment past records it never read",
    everywhere=_patches((run_protocol, "untouched", _past_unread)),
)

GRANT_EVERY_DOUBT = Mutant(
    "grant-every-doubt",
    "a claim's rerun decision is spent on every call in doubt, named in it or not",
    everywhere=_patches((run_steps, "granted", _every_doubt_granted)),
)

DOUBT_IGNORED = Mutant(
    "doubt-ignored",
    "recovery reruns a non-idempotent call in doubt without a decision",
    everywhere=_patches((run_steps, "calls_in_doubt", _no_doubt)),
)

#: Every mutant of the kit, stores' first.
MUTANTS: tuple[Mutant, ...] = (
    FENCED_STARTED,
    TAKEN_POSITION,
    STALE_STEP,
    LEASE_BROKEN,
    RENEW_STEALS,
    CLAIM_TRUSTS_READ,
    DONE_NOT_FINAL,
    LEASE_UNCONFIRMED,
    TAKE_BACK_CLAIMED,
    HANDOFF_PAST_UNREAD,
    GRANT_EVERY_DOUBT,
    DOUBT_IGNORED,
)
