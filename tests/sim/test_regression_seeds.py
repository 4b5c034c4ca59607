"""Every bug the simulation found, as the seed of the episode that found it: each must hold now.

Each seed is an episode seed (what a failure prints; ``make sim SETUP=... SEED=...`` replays
it). A seed pins one schedule of today's code: a change that moves the points (a new store
operation in a superstep) replays a different story, which is why each bug also has a plain
test (named below). Where the fix can be put back (`reverts`), the seed must fail without
it: that is the proof the simulation finds the bug by itself, and the sign that a seed went
stale and should be found again (``python tests/sim/hunt.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from reverts import claim_read_trusted, records_overwritable

from agentflow.sim import SETUPS, Config, Report, describe, run_simulation


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def replay(setup: str, seed: int) -> Report:
    return run_simulation(SETUPS[setup](), 0, Config(steps=1), only_episode=seed)


#: Race 1, a claim racing a late started: found on memory with the fix reverted after 139,935
#: steps (5.3 s, simulation seed 2). Plain test: tests/protocol/test_claim_races.py, the first.
CLAIM_RACE = ("memory", 1834978201)
#: Race 2, a rewound record counter: found on fakeredis with the fix reverted (see RECORDS_RACE's note).
#: Plain test: the second in tests/protocol/test_claim_races.py.
RECORDS_RACE = ("fakeredis", 0)
#: An operator's "did not happen" decided before a stalled worker's late done: found with both race
#: fixes in place, by `make sim` seed 7 on memory after 82,991 steps (3.3 s). Plain test: the third.
LATE_DONE = ("memory", 3614766610)
#: A worker stalled between a call's started record and its effect has the effect after the
#: operator's "did not happen" and the retry's rerun (the zombie window: docs/simulation.md):
#: found on fakeredis by the race-2 hunt, seed 1, after 283,795 steps (52.6 s).
ZOMBIE_AFTER_RETRY = ("fakeredis", 2983490159)
#: A run parked on a call whose stalled worker then logged the call's done: the sweep left it
#: parked, waiting for nobody. Found by `make sim` seed 12 on fakeredis after 327,700 steps
#: (72 s). Plain test: tests/celery/test_recover_all_logic.py, the parked run whose call ended.
LATE_DONE_WHILE_PARKED = ("fakeredis", 240065136)


def test_the_claim_race_seed_holds_and_fails_without_the_fix() -> None:
    assert replay(*CLAIM_RACE).failure is None, describe(replay(*CLAIM_RACE))
    with claim_read_trusted():
        found = replay(*CLAIM_RACE).failure
    assert found is not None and "had its effect 2 times" in found.invariant


def test_the_rewound_counter_seed_holds_and_fails_without_the_fix() -> None:
    assert replay(*RECORDS_RACE).failure is None, describe(replay(*RECORDS_RACE))
    with records_overwritable():
        found = replay(*RECORDS_RACE).failure
    assert found is not None and "had its effect 2 times" in found.invariant


@pytest.mark.parametrize(
    "found",
    [LATE_DONE, ZOMBIE_AFTER_RETRY, LATE_DONE_WHILE_PARKED],
    ids=["late-done", "zombie-after-retry", "late-done-while-parked"],
)
def test_a_seed_that_found_a_bug_holds(found: tuple[str, int]) -> None:
    report = replay(*found)
    assert report.failure is None, describe(report)
    assert report.effects > 0
