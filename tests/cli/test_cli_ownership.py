"""Who did what, on the command line: segment owners, operators (``--as``), and runs live on a worker.

A live run is held with the store's own lease (``take_lease``), as a worker holds it while
it moves the run: the CLI must show it as running there, never as in doubt, and must not
act on it.
"""

from __future__ import annotations

import getpass

import runs_kit
from runs_kit import HOLDER, hold, one_line_error, stored

APP = "runs_kit:app"


def segment_lines(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.strip().startswith(("segment ", "decided by "))]


def test_show_names_who_held_each_segment_and_who_decided_the_resume(agentflow):
    # Given refund-1, paused by the kit's worker
    # When alice approves it from the command line
    resumed = agentflow("resume", "refund-1", "--app", APP, "--approve", "--as", "alice")
    assert resumed.exit_code == 0, resumed.output
    # Then runs show names the worker that started it, the CLI process that resumed it, and alice
    start, claim, decided = segment_lines(agentflow("runs", "show", "refund-1").stdout)
    assert start.startswith("segment 0: started the run at step 0, held by runner@")
    assert claim.startswith("segment 2: claimed it (resume) at step 2, held by cli@")
    assert decided.startswith("decided by alice at ")


def test_the_operator_comes_from_the_environment_else_the_login_name(agentflow, db):
    # Given AGENTFLOW_OPERATOR names bob, and --as is not given
    assert agentflow("resume", "refund-1", "--app", APP, "--deny", env={"AGENTFLOW_OPERATOR": "bob"}).exit_code == 0
    # Then bob is the operator of the decision
    assert "decided by bob at" in agentflow("runs", "show", "refund-1").stdout
    # and without it, the login name is
    runs_kit.as_worker(db, "park", "ship-1")
    recovered = agentflow("recover", "ship-1", "--app", APP, "--rerun-in-doubt", env={"AGENTFLOW_OPERATOR": None})
    assert recovered.exit_code == 0, recovered.output
    assert f"decided by {getpass.getuser()} at" in agentflow("runs", "show", "ship-1").stdout


def test_an_empty_operator_name_is_refused(agentflow):
    result = agentflow("resume", "refund-1", "--app", APP, "--approve", "--as", " ")
    assert result.exit_code == 2
    assert "--as" in result.stderr and "give a name" in result.stderr
    assert runs_kit.REFUNDS == []


def test_a_live_run_is_shown_running_on_its_holder_not_in_doubt(agentflow, db):
    # Given ship-1, whose ship call is logged as started with no result, held by a live worker
    lease = hold(db, "ship-1")
    # When it is shown and listed
    shown = agentflow("runs", "show", "ship-1").stdout
    listing = agentflow("runs", "list").stdout
    # Then it runs on that worker, until its lease ends; its call is not in doubt and no rerun is advised
    assert f"running on {HOLDER} until " in shown
    assert "its calls are under way there, not in doubt" in shown
    assert "marks: live" in shown and "check at their system" not in shown
    (row,) = [line for line in listing.splitlines() if line.startswith("ship-1")]
    assert f"live on {HOLDER}" in row and "in doubt" not in row
    assert lease.expires_at > 0


def test_recover_leaves_a_live_run_alone_and_says_who_holds_it(agentflow, db):
    # Given ship-1 held by a live worker
    hold(db, "ship-1")
    before = stored(db, "ship-1")
    # When it is recovered, even with --rerun-in-doubt
    result = agentflow("recover", "ship-1", "--app", APP, "--rerun-in-doubt", "--as", "alice")
    # Then the run is reported as held by that worker, until its lease ends, and nothing ran
    assert f"ship-1  held     held by {HOLDER} until " in result.stdout
    assert "1 run(s) are live on their workers and were left alone" in result.stdout
    assert result.exit_code == 0, result.output  # a live run is in good hands: not a failure to recover
    assert stored(db, "ship-1") == before


def test_resume_of_a_held_run_fails_in_one_line_naming_the_holder(agentflow, db):
    # Given refund-1, paused, while another process holds its lease
    hold(db, "refund-1")
    before = stored(db, "refund-1")
    # When it is approved from the command line
    result = agentflow("resume", "refund-1", "--app", APP, "--approve", "--as", "alice")
    # Then the command fails as for any conflict, naming the holder and when its lease ends, and nothing ran
    assert result.exit_code == 2
    error = one_line_error(result)
    assert f"run 'refund-1' is held by {HOLDER} until " in error and "UTC" in error
    assert runs_kit.REFUNDS == [] and stored(db, "refund-1") == before


def test_a_parked_run_says_what_it_waits_for_and_how_to_decide(agentflow, db):
    # Given ship-1 parked by a worker on its call in doubt
    runs_kit.as_worker(db, "park", "ship-1")
    # When it is shown
    out = agentflow("runs", "show", "ship-1").stdout
    # Then it waits for a decision about ship, with the command that decides
    assert "marks: in doubt, waiting for a decision" in out
    assert "waiting for a decision about calls in doubt: ship (call 1/ship/0/" in out
    assert "check each at its system, then decide: agentflow decide ship-1 --app ... --call CALL_ID=" in out
    assert "--rerun-in-doubt" not in out
    assert "parked it (calls in doubt wait for a decision) at step 2, held by worker-9@host-c:99" in out


def test_a_stored_decision_names_its_operator_and_waits_for_a_worker(agentflow, db):
    # Given ship-1, whose call in doubt carol checked and decided to run again (stored, not spent)
    runs_kit.as_worker(db, "decide", "ship-1", operator="carol")
    # When it is shown
    out = agentflow("runs", "show", "ship-1").stdout
    # Then the decision is shown with carol's name, and no other advice
    assert "decided by carol at " in out and "the next worker to take the run spends it" in out
    assert "check at their system" not in out
