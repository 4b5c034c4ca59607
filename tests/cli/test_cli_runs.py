"""``agentflow runs list`` and ``agentflow runs show`` on a store filled by real runs."""

from __future__ import annotations

import runs_kit
from runs_kit import one_line_error

from agentflow.cli._show import run_text
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.run.read import read_run
from agentflow.exec.run.view import RunReport
from agentflow.exec.seal import Sealer


def rows(output: str) -> dict[str, str]:
    return {line.split()[0]: line for line in output.splitlines()[1:] if line.strip() and "run(s)" not in line}


def test_list_shows_every_run_with_its_status_and_marks(agentflow):
    # Given the demo's runs plus a paused, an in-doubt and a tampered run
    # When they are listed
    result = agentflow("runs", "list")
    # Then each run has its status and marks, and the tampered one is CORRUPT with its reason
    assert result.exit_code == 0, result.output
    listed = rows(result.stdout)
    assert set(listed) == {"order-1", "order-2", "order-3", "refund-1", "refund-2", "ship-1", "tamper-1"}
    assert "recovered" in listed["order-2"] and "done" in listed["order-2"]
    assert "recovered" not in listed["order-1"]
    assert "paused" in listed["refund-1"]
    assert "in doubt" in listed["ship-1"] and "running" in listed["ship-1"]
    assert "CORRUPT: checkpoint 1 of run 'tamper-1': signature does not match" in listed["tamper-1"]
    # and nothing read from the tampered run is shown as data
    assert "shipping" not in listed["tamper-1"]


def test_list_filters_by_flow_and_status(agentflow):
    assert set(rows(agentflow("runs", "list", "--flow", "refunds").stdout)) == {"refund-1", "refund-2"}
    assert set(rows(agentflow("runs", "list", "--status", "paused").stdout)) == {"refund-1", "refund-2"}
    assert set(rows(agentflow("runs", "list", "--status", "corrupt").stdout)) == {"tamper-1"}
    assert agentflow("runs", "list", "--flow", "nothing").stdout.strip() == "no runs match"


def test_show_a_recovered_run_tells_who_held_it_and_what_was_rerun(agentflow):
    result = agentflow("runs", "show", "order-2")
    assert result.exit_code == 0, result.output
    out = result.stdout
    # the history, with the claim of the recovering worker
    assert "claim (recovery)" in out
    assert "segment 3: claimed it (recovery) at step 3" in out
    # the call log with each call's state
    assert "hold_seats" in out and "charge_card" in out
    assert "rerun after recovery" in out
    # the recovered info and the state at the latest checkpoint
    assert "recovery (checkpoint 4): replayed nothing; rerun 2/send/0/" in out
    assert '"note": "tickets for Tosca sent"' in out


def test_a_hint_through_the_workers_names_a_command_through_the_workers(db):
    # Given ship-1, its ship call in doubt, read as `runs show --workers` reads it
    async def read() -> RunReport:
        async with SQLiteCheckpointStore(db) as store:
            return await read_run(store, Sealer(runs_kit.KEY), "ship-1")

    text = run_text(runs_kit.in_thread(read), None, "workers.celery_app:tasks")
    # Then the command it names signs a decision for the workers, and none runs the tool here
    assert "agentflow decide ship-1 --workers workers.celery_app:tasks --call CALL_ID=" in text
    assert "--app" not in text and "--rerun-in-doubt" not in text


def test_show_marks_a_call_in_doubt(agentflow):
    out = agentflow("runs", "show", "ship-1").stdout
    assert "marks: in doubt" in out
    assert "in doubt  0" in out and "started on " in out and "UTC, no result" in out
    assert "agentflow decide ship-1 --app ... --call CALL_ID=rerun|happened:JSON|not:REASON --as NAME" in out
    assert "--rerun-in-doubt" not in out


def test_show_a_paused_run_lists_its_pending_approval(agentflow):
    out = agentflow("runs", "show", "refund-1").stdout
    assert "Waiting for approval" in out
    assert 'refund {"amount": 90, "order": "order-1"}' in out
    assert "agentflow resume refund-1" in out


def test_show_never_prints_the_principal_nor_its_proof(agentflow):
    # Given a run started for alice with a principal (a credential)
    result = agentflow("runs", "show", "refund-2")
    # Then user and thread are shown, and of the principal only that it is set
    assert "identity: user alice, thread t-9, principal: set" in result.stdout
    proof = Sealer(runs_kit.KEY).principal_proof("refund-2", runs_kit.PRINCIPAL)
    for secret in (runs_kit.PRINCIPAL, proof, proof.split(":")[1]):
        assert secret not in result.output


def test_show_a_tampered_run_shows_the_problem_and_no_data(agentflow):
    result = agentflow("runs", "show", "tamper-1")
    assert result.exit_code == 1
    assert "checkpoint 1 of run 'tamper-1': signature does not match" in result.stdout
    assert "berlin" not in result.output.lower()
    assert "tamper-1" in one_line_error(result)


def test_show_an_unknown_run_is_one_line(agentflow):
    result = agentflow("runs", "show", "no-such-run")
    assert result.exit_code == 2
    assert "no run 'no-such-run'" in one_line_error(result)


def test_list_says_when_more_runs_exist_than_it_read_and_how_to_see_them(agentflow):
    # Given a store with more runs than --limit
    every = rows(agentflow("runs", "list").output)
    assert len(every) > 2
    # When the newest two are listed, Then the listing says more exist and how to read them
    cut = agentflow("runs", "list", "--limit", "2")
    assert cut.exit_code == 0 and len([r for r in rows(cut.output) if r != "more"]) == 2
    assert "more runs exist than the newest 2 read: --limit 4 reads more, --all reads every run" in cut.output
    # And --all lists every run, with no such line
    whole = agentflow("runs", "list", "--all")
    assert rows(whole.output) == every and "more runs exist" not in whole.output
