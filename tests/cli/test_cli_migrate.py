"""``agentflow migrate`` and ``needs migration``: a run whose flow version a deploy retired.

refund-1 is paused on version 1 of the refunds flow; ``runs_kit:app_v2`` has version 2 only.
"""

from __future__ import annotations

import runs_kit

V2 = "runs_kit:app_v2"


def test_runs_list_and_show_mark_a_run_whose_version_the_app_lacks(agentflow):
    listed = agentflow("runs", "list", "--app", V2)
    assert listed.exit_code == 0, listed.output
    (line,) = [ln for ln in listed.stdout.splitlines() if ln.startswith("refund-1")]
    assert "needs migration" in line
    (done,) = [ln for ln in listed.stdout.splitlines() if ln.startswith("order-1")]
    assert "needs migration" not in done  # a finished run needs nothing
    shown = agentflow("runs", "show", "refund-1", "--app", V2)
    assert shown.exit_code == 0, shown.output
    assert "version 1" in shown.stdout and "needs migration: version 1 of its flow is not in the app" in shown.stdout
    assert "agentflow migrate refund-1 --to VERSION" in shown.stdout
    # Without --app nothing is claimed about deploys
    assert "needs migration" not in agentflow("runs", "show", "refund-1").stdout


def test_acting_on_a_run_whose_version_the_app_lacks_says_so_and_touches_nothing(agentflow, db):
    before = runs_kit.stored(db, "refund-1")
    said = agentflow("resume", "refund-1", "--app", V2, "--approve")
    assert said.exit_code != 0
    assert "needs migration" in said.output and "version '1'" in said.output
    assert runs_kit.stored(db, "refund-1") == before and runs_kit.REFUNDS == []


def test_migrate_moves_the_run_to_version_2_where_it_is_approved_and_finishes(agentflow, db):
    moved = agentflow(
        "migrate", "refund-1", "--to", "2", "--state", "runs_kit:in_euros", "--app", V2, "--as", "ops"
    )  # fmt: skip
    assert moved.exit_code == 0, moved.output
    assert "migrated to version 2" in moved.stdout and "the next recovery carries it on" in moved.stdout
    shown = agentflow("runs", "show", "refund-1", "--app", V2).stdout
    assert "version 2" in shown and "claim (migrate)" in shown and "needs migration" not in shown
    # It goes on under version 2, which asks for the approval again
    recovered = agentflow("recover", "refund-1", "--app", V2)
    assert recovered.exit_code == 0, recovered.output
    assert "paused" in recovered.stdout
    approved = agentflow("resume", "refund-1", "--app", V2, "--approve")
    assert approved.exit_code == 0, approved.output
    assert runs_kit.REFUNDS == ["order-1"]


def test_migrate_refuses_a_bad_state_function_or_version_and_writes_nothing(agentflow, db):
    before = runs_kit.stored(db, "refund-1")
    for argv, said in (
        (["--state", "runs_kit:NOT_A_FUNCTION"], "is not a function"),
        (["--state", "runs_kit"], "package.module:attribute"),
        (["--to", "9"], "no version '9'"),
        ([], "does not fit RefundV2"),  # version 2 needs a currency: without --state the old state does not fit
    ):
        result = agentflow("migrate", "refund-1", "--app", V2, *argv)
        assert result.exit_code != 0 and said in result.output, (argv, result.output)
    assert runs_kit.stored(db, "refund-1") == before
