"""``agentflow recover RUN_ID...`` acts on the runs named; ``recover --flow FLOW`` lists its runs and asks first."""

from __future__ import annotations

from pathlib import Path

import pytest
import runs_kit
from runs_kit import one_line_error, stored

from agentflow.cli import _cmd_recover
from agentflow.exec.checkpoints import SQLiteCheckpointStore

APP = "runs_kit:app"


def strand_another_shipping_run(db: Path, run_id: str = "ship-2") -> str:
    """A second shipping run whose worker died inside ship (its call in doubt), next to ship-1."""

    async def write() -> None:
        runs_kit.CRASH.add("ship")
        async with SQLiteCheckpointStore(db) as store:
            with pytest.raises(runs_kit.WorkerDied):
                await runs_kit.app.runner(store, runs_kit.KEY).run(
                    runs_kit.shipping, runs_kit.Parcel(address="Porto"), run_id=run_id
                )

    runs_kit.in_thread(write)
    return run_id


def test_recover_moves_the_named_run_and_no_other_of_its_flow(agentflow, db):
    # Given two shipping runs whose workers died inside ship
    other = strand_another_shipping_run(db)
    before = stored(db, other)
    # When the operator recovers ship-1 by its id, rerunning its call in doubt
    result = agentflow("recover", "ship-1", "--app", APP, "--rerun-in-doubt", "--as", "ana")
    # Then ship-1 is done, and the other run of the same flow was not touched
    assert result.exit_code == 0, result.output
    assert "ship-1  done" in result.stdout and other not in result.stdout
    assert stored(db, other) == before
    listing = agentflow("runs", "list", "--flow", "shipping").stdout
    (row,) = [line for line in listing.splitlines() if line.startswith(other)]
    assert "running" in row and "in doubt" in row


def test_recover_flow_lists_its_runs_and_without_a_terminal_refuses_to_go_on_without_yes(agentflow, db):
    other = strand_another_shipping_run(db)
    before = {run_id: stored(db, run_id) for run_id in ("ship-1", other)}
    # When every run of the flow is to be recovered, from a script (no terminal to ask on)
    result = agentflow("recover", "--flow", "shipping", "--app", APP, "--rerun-in-doubt")
    # Then the runs it would act on are listed, it says to add --yes, and nothing was touched
    assert result.exit_code == 2
    assert "ship-1  shipping  running" in result.stdout and f"{other}  shipping  running" in result.stdout
    assert "tamper-1" not in result.stdout  # a finished run is not recovered
    assert "say --yes to go ahead (no terminal to ask)" in one_line_error(result)
    assert {run_id: stored(db, run_id) for run_id in before} == before
    # When the operator says --yes
    agreed = agentflow("recover", "--flow", "shipping", "--app", APP, "--rerun-in-doubt", "--yes")
    # Then every listed run is recovered
    assert agreed.exit_code == 0, agreed.output
    assert "ship-1  done" in agreed.stdout and f"{other}  done" in agreed.stdout
    assert "recovering 2 run(s) of shipping" in agreed.stderr


@pytest.mark.parametrize(("answer", "recovered"), [("n\n", False), ("y\n", True)])
def test_recover_flow_asks_on_a_terminal(agentflow, db, monkeypatch, answer, recovered):
    # Given a terminal to ask on
    monkeypatch.setattr(_cmd_recover, "_can_ask", lambda: True)
    before = stored(db, "ship-1")
    # When the flow's runs are to be recovered and the operator answers
    result = agentflow("recover", "--flow", "shipping", "--app", APP, "--rerun-in-doubt", input=answer)
    # Then the runs are listed, the question asked, and the answer kept
    assert result.exit_code == 0, result.output
    assert "ship-1  shipping  running" in result.stdout
    assert "Recover the 1 unfinished run(s) of shipping listed? [y/N]" in result.stderr
    if recovered:
        assert "ship-1  done" in result.stdout
    else:
        assert "nothing was recovered" in result.stdout and stored(db, "ship-1") == before


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "name the runs to recover (RUN_ID...), or --flow FLOW"),
        (["ship-1", "--flow", "shipping"], "name the runs to recover (RUN_ID...), or --flow FLOW"),
    ],
)
def test_recover_needs_run_ids_or_a_flow(agentflow, args, says):
    result = agentflow("recover", *args, "--app", APP)
    assert result.exit_code == 2
    assert says in result.stderr


def test_recover_of_a_flow_name_as_a_run_id_says_how_to_recover_a_flow(agentflow, db):
    # Given the old form: a flow's name where the run ids go, next to a run id that exists
    before = stored(db, "ship-1")
    result = agentflow("recover", "ship-1", "shipping", "--app", APP, "--rerun-in-doubt")
    # Then nothing is recovered (not even ship-1), and the line says how to name a flow
    assert result.exit_code == 2
    line = one_line_error(result)
    assert "no run 'shipping' in this store (for the unfinished runs of flow 'shipping': --flow shipping)" in line
    assert stored(db, "ship-1") == before
