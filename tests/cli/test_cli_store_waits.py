"""``agentflow runs show`` and the read model say a run waits for its store's durability, and until when.

A worker whose store could not confirm a write the superstep needed (`StoreNotDurable`)
leaves the run's ``store-wait`` marker (`agentflow.exec.run.store_waits`); the real
workers that leave it are tests/celery/test_store_durability_workers.py. Here the marker is
left as a worker leaves it, on a run a dead worker left behind.
"""

from __future__ import annotations

import time

from store_wait_kit import WHY, read, wait_for_store


def test_runs_show_says_the_run_waits_for_its_store_and_when_it_is_tried_again(db, agentflow):
    # Given a run whose worker stopped because the store could not confirm its write; tried again in a minute
    wait_for_store(db, "ship-1", 60.0)
    # When an operator shows it
    shown = agentflow("runs", "show", "ship-1")
    # Then it says so first, with the store's word and when the worker tries again
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("waiting for its store's durability since "))
    assert "the started record 1.0 is on the Redis primary" in lines[at]
    assert lines[at + 1].startswith("  its worker tries again at 20")
    # And once the worker's tries are spent, it says recover_all has the run
    wait_for_store(db, "ship-1", None)
    spent = agentflow("runs", "show", "ship-1").output
    assert "its worker's tries are spent: recover_all carries it on" in spent


def test_the_read_model_shows_the_wait_only_at_the_step_it_names(db):
    # Given a marker naming a step the run has moved past (two steps ago)
    wait_for_store(db, "ship-1", 5.0, step_offset=-2)
    # Then it is not shown: that superstep is over
    assert read(db, "ship-1").waiting_for_store is None
    # And one naming the run's latest step is, with its step, its reason and when it is tried again
    wait_for_store(db, "ship-1", 5.0)
    report = read(db, "ship-1")
    assert report.waiting_for_store is not None
    assert report.waiting_for_store.step == report.step and report.waiting_for_store.why == WHY
    assert report.waiting_for_store.retry_at is not None and report.waiting_for_store.retry_at > time.time()
    # And a run that ended is not shown waiting, whatever its marker says
    wait_for_store(db, "refund-1", 5.0)
    assert read(db, "refund-1").waiting_for_store is None
