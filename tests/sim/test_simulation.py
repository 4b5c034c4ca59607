"""The simulation as a test: a slice of `make sim` on every store set-up, and the simulation's own rules.

`make sim` runs a million steps per set-up; here each set-up gets a few seconds on a fixed
seed (``SIM_SEED=...`` explores others). A failure prints the episode seed that replays it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from test_regression_seeds import FOUND

from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.memory import MemoryCheckpointStore
from agentflow.sim import SETUPS, Config, Faults, custom, describe, run_simulation
from agentflow.sim._deploys import KINDS
from agentflow.sim._shrink import shrink

#: Slices of the simulation: seconds each (make check leaves them to make test).
pytestmark = pytest.mark.slow

#: Steps of the slice per set-up (memory runs about 13,000 a second here, SQLite 2,000, fakeredis 3,000): the
#: shortest on this seed in which every fault, wait, deploy, fork and migration of the first test happens.
SLICE = {"memory": 120_000, "sqlite": 35_000, "fakeredis": 20_000}
#: Steps of the lease-giving save's slice: long enough for a few hundred such saves at raised failure rates.
SAVE_SLICE = {"memory": 80_000, "sqlite": 16_000, "fakeredis": 13_000}
#: The seed of the slices (SIM_SEED=... explores others; `make sim SEED=...` replays an episode).
SEED = int(os.environ.get("SIM_SEED", "20261202"))


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    """The library logs every lost lease and refused write: thousands in a slice."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("setup", sorted(SLICE))
def test_the_run_protocol_keeps_every_invariant_under_faults(setup: str) -> None:
    report = run_simulation(SETUPS[setup](), SEED, Config(steps=SLICE[setup]))
    assert report.failure is None, describe(report)
    # The net was really spread: every kind of fault fired, and runs finished and had effects.
    kinds = {"crash", "stall", "store-fails-before", "store-fails-after", "message-lost", "message-doubled"}
    assert kinds <= set(report.stats.faults), describe(report)
    assert report.ends.get("done", 0) > 0 and report.effects > 0, describe(report)
    # And runs waited on every path a run can wait on, under those faults: a timer and a child run on
    # every set-up, an approval's deadline on memory, whose slice is long enough to see one. (A
    # deadline's wake needs the operator to leave an approval unanswered for 90 s: about one in
    # 40,000 steps on fakeredis before the reach was raised, none in 80,000 since, when the faults
    # drawn per episode keep more wire runs in recovery; `make sim` counts them per set-up.)
    waits = {"wake:timer", "wake:child"} | ({"wake:approval"} if setup == "memory" else set())
    assert waits <= set(report.claims), describe(report)
    # And the code was redeployed mid-episode in every way (`_deploys.KINDS`), and the operator
    # forked runs and migrated runs to a newer flow version, under the same invariants
    assert set(KINDS) <= set(report.stats.faults), describe(report)
    assert report.claims["fork"] > 0 and report.claims["migrate"] > 0, describe(report)


@pytest.mark.parametrize("setup", sorted(SLICE))
def test_the_save_that_gives_a_lease_up_is_simulated_under_every_fault_of_a_store_write(setup: str) -> None:
    # Given a slice of the simulation on a store that moves leases with its writes (all three do), with
    # store failures five times as likely as by default (a slice makes a few hundred such saves: at the
    # default rates, whether one of them fails after it took effect is a coin toss)
    faults = Faults(store_before=0.02, store_after=0.02, deploy=0.0)  # no deploys: the store writes alone
    # (the rates as given in every episode: swarm testing would turn some of them off in some episodes)
    report = run_simulation(SETUPS[setup](), SEED, Config(steps=SAVE_SLICE[setup], faults=faults, reach=None))
    assert report.failure is None, describe(report)
    # Then workers saved their last step giving the lease up with it, and that write failed before
    # and after it took effect, and a worker crashed and stalled right after it
    covered = {kind for kind, point in report.stats.covered if point.startswith("store.save_moving")}
    assert "store.save_moving" in report.stats.points, describe(report)
    assert {"store-fails-before", "store-fails-after"} <= covered and covered & {"crash", "stall"}, covered


def test_the_redis_setup_models_a_rewound_record_counter() -> None:
    report = run_simulation(SETUPS["fakeredis"](), SEED, Config(steps=20_000))
    assert report.failure is None, describe(report)
    assert report.stats.faults["tamper"] > 0, describe(report)


@pytest.mark.parametrize("setup", sorted(SLICE))
def test_an_episode_replays_exactly_from_its_seed(setup: str) -> None:
    # Given one episode run twice from its seed, on fresh storage each time
    runs = [run_simulation(SETUPS[setup](), 0, Config(steps=1), only_episode=4242) for _ in range(2)]
    # Then every choice, fault and effect is the same
    assert runs[0].stats.steps == runs[1].stats.steps > 100
    assert runs[0].stats.faults == runs[1].stats.faults
    assert runs[0].stats.covered == runs[1].stats.covered and runs[0].stats.points == runs[1].stats.points
    assert (runs[0].effects, runs[0].ends) == (runs[1].effects, runs[1].ends)


class UnfencedStore(MemoryCheckpointStore):
    """A store that forgot fencing: it takes a ``started`` record in any segment (what the conformance kit refuses)."""

    async def record_call(self, run_id, record):
        rows = self._checkpoints.get(run_id)
        if rows and record.kind == "started" and record.segment != rows[-1].segment:
            self._calls.setdefault(run_id, {}).setdefault(record.segment, []).append(record)
            return
        await super().record_call(run_id, record)


def test_a_store_of_your_own_runs_the_simulation_and_a_broken_one_is_caught() -> None:
    # Given a custom set-up, as a store author writes one
    def episode(tag: str) -> Callable[[], CheckpointStore]:
        store = UnfencedStore()
        return lambda: store

    report = run_simulation(custom("unfenced-memory", episode), 3, Config(steps=400_000))
    # Then the simulation finds the missing fence: a call runs twice
    assert report.failure is not None, describe(report)
    assert "had its effect 2 times" in report.failure.invariant or "started" in report.failure.invariant


def test_a_failure_shrinks_to_the_faults_it_needs_and_still_fails() -> None:
    # Given the episode that finds race 1 with its fix reverted (the seed kept with the others: test_regression_seeds)
    _, setup, seed, faults, revert, *_ = next(found for found in FOUND if found[0] == "claim-race")
    # the seed pins a schedule of the plain simulation, at its entry's rates (deploys off)
    config = Config(steps=1, reach=None) if faults is None else Config(steps=1, reach=None, faults=faults)
    with revert():
        found = run_simulation(SETUPS[setup](), 0, config, only_episode=seed).failure
        assert found is not None
        told = shrink(SETUPS[setup], found, config)
    kept = int(told.split(": ")[1].split(" of ")[0])
    assert kept <= len(found.faults)
    assert "invariant broken" in told and f"replay: make sim SETUP={setup} SEED={seed}" in told


def test_replaying_a_seed_with_faults_suppressed_is_the_shrinkers_replay() -> None:
    config = Config(steps=1)
    first = run_simulation(SETUPS["memory"](), 0, config, only_episode=77)
    assert first.failure is None
    quiet = run_simulation(SETUPS["memory"](), 0, replace(config, suppress=frozenset(range(1, 1000))), only_episode=77)
    assert sum(quiet.stats.faults.values()) == 0 and quiet.failure is None


def test_lost_acknowledged_writes_let_a_call_run_again_on_a_store_that_does_not_wait() -> None:
    # Given failovers that lose the writes acknowledged since the replica last caught up, on a
    # store that does not wait for its replica (memory)
    config = Config(steps=100_000, faults=Faults(lost_writes=0.002))
    report = run_simulation(SETUPS["memory"](), 1, config)
    # Then a lost `started` lets a call run again (or a lost step 0 loses a run, or a lost cancel lets
    # a call start after the run was cancelled)
    assert report.stats.faults["lost-writes"] > 0
    assert report.failure is not None, describe(report)
    broke = report.failure.invariant
    assert any(what in broke for what in ("had its effect 2 times", "did not end", "after the run was cancelled"))


def test_lost_acknowledged_writes_break_nothing_when_the_store_waits_for_its_replica() -> None:
    # Given the same failovers, on a store that waits for its replica on the writes the promise
    # stands on, by the rule RedisCheckpointStore(wait_replicas=1) uses (half the steps: about 90 failovers)
    config = Config(steps=50_000, faults=Faults(lost_writes=0.002))
    report = run_simulation(SETUPS["memory-waiting"](), 1, config)
    # Then every invariant holds: no call ran twice, no run was lost, every run ended
    assert report.stats.faults["lost-writes"] > 50
    assert report.failure is None, describe(report)


class Interrupted(BaseException):
    """What a test's time limit or Ctrl-C raises inside whatever code runs (no `Exception`)."""


class InterruptedStore(MemoryCheckpointStore):
    """A store whose 20th save is interrupted from outside."""

    saves = 0

    async def save(self, run_id, step, checkpoint):
        InterruptedStore.saves += 1
        if InterruptedStore.saves == 20:
            raise Interrupted
        await super().save(run_id, step, checkpoint)


def test_an_actor_stopped_from_outside_stops_the_simulation_and_is_no_broken_invariant() -> None:
    # Given an episode in which an actor is interrupted from outside (as pytest-timeout does)
    def episode(tag: str) -> Callable[[], CheckpointStore]:
        store = InterruptedStore()
        return lambda: store

    # Then the interruption goes on up, instead of being reported as an actor that raised
    with pytest.raises(Interrupted):
        run_simulation(custom("interrupted-memory", episode), 3, Config(steps=5_000))
