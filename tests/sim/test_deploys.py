"""Deploys, forks and migrations in the simulation: each invariant that concerns them catches its bug.

The slices of `test_simulation` run deploys, forks and migrations on every set-up and hold
(every kind of deploy fires, runs are forked and migrated);
here each rule they add is shown to catch a planted bug (a patch of this process only):
- a fork whose calls kept the source run's identities (their idempotency keys);
- a migration let through with a call of the step it goes on with in doubt or finished;
- a flag flip that reruns an old call is `test_regression_seeds`' ``flipped-to-idempotent``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest

from agentflow.exec.context import CallInfo
from agentflow.exec.run.protocol import RunProtocol
from agentflow.sim import SETUPS, Config, Faults, describe, run_simulation


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


@contextmanager
def forks_keep_identities() -> Iterator[None]:
    """A planted bug: a call's idempotency key leaves its run out, so a fork's calls have its source's keys."""

    def by_call_only(self: CallInfo) -> str:
        return "af-" + hashlib.sha256(self.call_id.encode()).hexdigest()[:40]

    with mock.patch.object(CallInfo, "idempotency_key", property(by_call_only)):
        yield


@contextmanager
def migrations_unchecked() -> Iterator[None]:
    """A planted bug: `migrate` reads no call of the step the run goes on with, so it never refuses."""
    real = RunProtocol._migrate

    async def careless(self: Any, run_id: str, *args: Any) -> Any:
        self.driver.seeds = lambda cur, records: {}  # this protocol only: it is made for the one migration
        return await real(self, run_id, *args)

    with mock.patch.object(RunProtocol, "_migrate", careless):
        yield


@pytest.mark.slow  # a hunt over many episodes
def test_a_fork_whose_calls_kept_the_source_runs_identities_is_caught() -> None:
    # Given forks by the operator, whose calls (planted bug) have the idempotency keys of the run forked
    config = Config(steps=60_000, fork=0.2)
    with forks_keep_identities():
        report = run_simulation(SETUPS["memory"](), 1, config)
    # Then a fork's call has its effect under the identity of a call of the run it was forked from
    assert report.failure is not None, describe(report)
    assert "under the identity of a call of" in report.failure.invariant, report.failure


def test_a_migration_past_a_call_of_its_step_is_caught() -> None:
    # Given new flow versions deployed often, and an operator who migrates at most visits, through a
    # migrate that (planted bug) does not look at the calls of the step the run goes on with
    config = Config(steps=60_000, migrate=0.8, faults=Faults(deploy=0.002))
    with migrations_unchecked():
        report = run_simulation(SETUPS["memory"](), 1, config)
    # Then a migrate claim is stored over a call finished or in doubt in that step
    assert report.failure is not None, describe(report)
    assert "with calls finished or in doubt in the step" in report.failure.invariant, report.failure
