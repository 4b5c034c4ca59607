"""A run's event stream across writers: a worker dies mid-run, another takes the run over, the stream reads clean.

Each held block records under a writer of its own (`agentflow.exec.run.events`); the one
that takes a run over after a crash starts its chain at the head the run's newest
checkpoint names, which the dead worker's last save signed. `_kit.event_streams` checks
the link and reads the stream back as ``agentflow verify`` and ``agentflow events`` do.
"""

from __future__ import annotations

from typing import Any

import pytest
from _kit.event_streams import assert_handed_on, writers
from _kit.stores import StoreSetup, setups
from _kit.tickets import KEY, ORDER, TICKETS, Crash, Tickets, make_tickets

from agentflow import Events, Executor, FlowRunner
from agentflow.exec.run import events as run_events
from agentflow.exec.run.events import Positions, stream_problems
from agentflow.exec.seal import Sealer


def recording_worker(setup: StoreSetup, tickets: Tickets) -> FlowRunner:
    """A worker of its own (store object, executor, hub) that records the run's events, as the Celery workers do."""
    executor = Executor(tickets.registry, events=Events(record=True))
    return FlowRunner(executor, checkpoints=setup.open(), checkpoint_key=KEY)


@pytest.mark.parametrize("store_setup", setups(), indirect=True)
async def test_a_run_taken_over_after_a_crash_reads_back_clean_from_both_writers(store_setup):
    # Given a ticket order driven a superstep per hold (as the Celery workers drive it), events
    # recorded, whose worker died right after charging the card
    tickets = make_tickets()
    first = recording_worker(store_setup, tickets)
    await first.start(TICKETS, ORDER, run_id="hand-1")
    await first.advance(TICKETS, "hand-1")
    tickets.crash_in.add("charge_card")
    with pytest.raises(Crash):
        await first.advance(TICKETS, "hand-1")
    # When a second worker recovers it to its end (the call in doubt rerun: the test's word)
    second = recording_worker(store_setup, tickets)
    assert (await second.recover(TICKETS, "hand-1", rerun_in_doubt=True)).status == "done"
    # Then the stream reads clean through verify's and events' readers, the second writer's
    # first entry follows the head the dead worker's last save signed, and the run ends once
    by = await assert_handed_on(store_setup.raw, Sealer(KEY), "hand-1")
    (_, held, died, recovering) = by  # the start's, hold's superstep, the one that died, the recovery
    assert died.names[-1] == "tool.started" and recovering.entries[0].prev == held.entries[-1].link
    assert died.entries[0].prev == held.entries[-1].link  # the stream forks there: both followed it
    assert "run.recovered" in recovering.names and recovering.names[-1] == "run.finished"
    assert sum(w.names.count("run.finished") for w in by) == 1


@pytest.mark.parametrize("store_setup", setups(), indirect=True)
async def test_a_run_s_end_goes_with_its_last_save_so_a_death_right_after_it_leaves_no_gap(store_setup, monkeypatch):
    # Given workers that die right after their block's last save: nothing they still buffer is
    # ever appended (the recorder's last append never runs, as in a process killed there)
    async def killed(self: Any) -> None:
        self._buffer.clear()

    monkeypatch.setattr(run_events._Recorder, "drain", killed)
    monkeypatch.setattr(run_events, "FLUSH_AFTER_S", 60.0)
    tickets = make_tickets()
    runner = recording_worker(store_setup, tickets)
    # When a run is started and driven a superstep per hold, as the Celery workers drive it
    await runner.start(TICKETS, ORDER, run_id="end-1")
    while (await runner.advance(TICKETS, "end-1")).status == "running":
        pass
    # Then its run.finished went with the save that ended it: verify finds nothing missing
    assert await stream_problems(store_setup.raw, Sealer(KEY), "end-1") == []
    last = (await writers(store_setup.raw, Sealer(KEY), "end-1"))[-1]
    assert last.entries[-1].names[-2:] == ["checkpoint.saved", "run.finished"]


def test_an_ended_run_without_its_end_is_worded_as_a_stop_or_a_removal_and_never_twice():
    # Given a stream of one writer w whose ending checkpoint names its entry "b" as the head,
    # and no run.finished of w after it (a save that did not carry the run's end)
    read = Positions()
    read.entry("1", "r", "a", ["w", 0], [0, ""])
    read.entry("2", "r", "b", ["w", 1], [1, "a"])
    anchor = {"writer": "w", "head": [1, "b"]}
    # Then the reader says it may be a writer that stopped there, or a removal: the rows read the same
    (problem,) = read.end("r", anchor, 4, ended=True)
    assert "stopped between the save and storing its last events" in problem and "or those entries" in problem
    # And when the head that checkpoint names is itself missing, that is the one problem named
    cut = Positions()
    cut.entry("1", "r", "a", ["w", 0], [0, ""])
    (problem,) = cut.end("r", anchor, 4, ended=True)
    assert "entry height 1 of run 'r'" in problem and "is missing" in problem
