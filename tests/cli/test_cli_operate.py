"""``agentflow decide``, ``agentflow cancel`` and ``agentflow fork``: an operator's actions on one run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import runs_kit
from runs_kit import one_line_error

from agentflow.exec.calls.read import read_log
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer

APP = "runs_kit:app"


def ship_call_id(db: Path) -> str:
    """The call id of ship-1's call in doubt (its ``ship``)."""

    async def read() -> str:
        async with SQLiteCheckpointStore(db) as store:
            records = await read_log(store, Sealer(runs_kit.KEY), "ship-1")
        (started,) = [r for r in records if r.kind == "started" and r.body.get("tool") == "ship"]
        return str(started.body["call_id"])

    return runs_kit.in_thread(read)


def state(db: Path, run_id: str) -> dict[str, object]:
    """The run's state at its latest checkpoint, as the read model shows it."""

    async def read() -> dict[str, object]:
        async with SQLiteCheckpointStore(db) as store:
            report = await read_run(store, Sealer(runs_kit.KEY), run_id)
        assert not report.problems, report.problems
        return dict(report.state)

    return runs_kit.in_thread(read)


def test_decide_happened_supplies_the_result_and_recover_finishes_without_shipping_again(agentflow, db):
    # Given ship-1, whose worker died inside ship (not idempotent); the parcel went out
    call_id = ship_call_id(db)
    # When the operator says it happened, with its label, and recovers the run
    word = f'{call_id}=happened:"shipped to Lisbon by hand"'
    said = agentflow("decide", "ship-1", "--app", APP, "--call", word, "--as", "ops")
    assert said.exit_code == 0, said.output
    assert "decision stored at step" in said.stdout
    recovered = agentflow("recover", "ship-1", "--app", APP)
    # Then the run finishes with the supplied result (ship never ran again: it would say "shipped to Lisbon")
    assert recovered.exit_code == 0, recovered.output
    assert "ship-1  done" in recovered.stdout
    assert state(db, "ship-1")["label"] == "shipped to Lisbon by hand"
    assert "ops" in agentflow("runs", "show", "ship-1").stdout


def test_decide_refuses_a_result_of_the_wrong_type_and_a_malformed_word(agentflow, db):
    call_id = ship_call_id(db)
    wrong = agentflow("decide", "ship-1", "--app", APP, "--call", f"{call_id}=happened:42")
    assert wrong.exit_code == 2 and "does not fit 'ship'" in one_line_error(wrong)
    malformed = agentflow("decide", "ship-1", "--app", APP, "--call", f"{call_id}=maybe")
    assert malformed.exit_code == 2 and "rerun, happened:JSON or not:REASON" in malformed.output
    neither = agentflow("decide", "ship-1", "--app", APP)
    assert neither.exit_code == 2 and "--rerun-all" in neither.output


def test_cancel_ends_a_paused_run_and_names_the_operator(agentflow):
    # When the operator cancels the paused refund-1
    result = agentflow("cancel", "refund-1", "--app", APP, "--reason", "asked twice", "--as", "ops")
    # Then it is cancelled, its refund never ran, and resume refuses it
    assert result.exit_code == 0, result.output
    assert "cancelled" in result.stdout
    assert runs_kit.REFUNDS == []
    again = agentflow("resume", "refund-1", "--app", APP, "--approve")
    assert again.exit_code == 2 and "not paused (cancelled)" in one_line_error(again)


def test_cancel_of_an_ended_run_is_refused(agentflow):
    result = agentflow("cancel", "tamper-1", "--app", APP, "--reason", "x")
    assert result.exit_code != 0


def test_fork_starts_a_new_run_from_a_checkpoint_with_a_patched_state(agentflow, db):
    # When the operator forks the paused refund-1 from its step 0 with another amount
    result = agentflow("fork", "refund-1", "--app", APP, "--at", "0", "--patch", '{"amount": 12}', "--new-id", "r-9")
    # Then the new run is saved at step 0 for a worker (not run here), naming its source
    assert result.exit_code == 0, result.output
    assert "run r-9 forked from refund-1 at step 0: running at step 0" in result.stdout
    assert state(db, "r-9")["amount"] == 12
    bad = agentflow("fork", "refund-1", "--app", APP, "--at", "0", "--patch", json.dumps(["no"]))
    assert bad.exit_code == 2 and "JSON object" in bad.output
    wrong = agentflow("fork", "refund-1", "--app", APP, "--at", "0", "--patch", '{"amount": "lots"}')
    assert wrong.exit_code == 2 and "does not fit" in one_line_error(wrong)
    typo = agentflow("fork", "refund-1", "--app", APP, "--at", "0", "--patch", '{"amout": 12}')
    assert typo.exit_code == 2 and "the patch names 'amout'" in one_line_error(typo)


def test_cancel_of_a_run_a_live_worker_holds_leaves_that_worker_a_request(agentflow, db):
    # Given ship-1, held by a live worker
    runs_kit.hold(db, "ship-1")
    before = runs_kit.stored(db, "ship-1")
    # When the operator cancels it
    result = agentflow("cancel", "ship-1", "--app", APP, "--reason", "sold out", "--as", "ops")
    # Then the command says the request waits for that worker, and the run itself is not written
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        "run ship-1: cancel requested (sold out); the live worker that holds it ends it before its next call "
        "(it is running now)"
    )
    assert runs_kit.stored(db, "ship-1") == before


def test_fork_run_exits_1_when_the_new_run_fails(agentflow, db):
    # Given a quote run that failed while the quote service was down, and the service still down
    runs_kit.add_failed(db)
    runs_kit.DOWN.append(True)
    try:
        # When it is forked and the new run is run here
        result = agentflow("fork", "quote-1", "--app", "runs_kit:quotes_app", "--at", "0", "--run", "--new-id", "q-2")
    finally:
        runs_kit.DOWN.clear()
    # Then the command says where the run landed, and exits 1 with its error, as retry does
    assert "run q-2 forked from quote-1 at step 0: failed" in result.stdout, result.output
    assert result.exit_code == 1 and "run 'q-2' failed: " in result.stderr and "quote service is down" in result.stderr


#: JSON no store keeps, and the words each is refused with (Python's own int-string limit is 4,300 digits).
UNSTORABLE_JSON = [
    pytest.param("1" * 5000, "an integer of 5000 digits", id="5000-digits"),
    pytest.param("[" * 100_000, "nests deeper than 200 levels", id="deep-unclosed"),
    pytest.param("[" * 300 + "]" * 300, "nests deeper than 200 levels", id="deep"),
    pytest.param('"\\ud800"', "holds a lone surrogate", id="lone-surrogate"),
    pytest.param("NaN", "NaN, which JSON does not allow", id="nan"),
]


@pytest.mark.parametrize(("text", "said"), UNSTORABLE_JSON)
def test_decide_and_fork_refuse_json_no_store_keeps_saying_what_to_fix(agentflow, db, text, said):
    # Given ship-1, with a call in doubt, and refund-1, paused
    call_id = ship_call_id(db)
    before = runs_kit.stored(db, "ship-1")
    # When an operator gives a result, or a patch, that no store keeps
    decided = agentflow("decide", "ship-1", "--app", APP, "--call", f"{call_id}=happened:{text}")
    forked = agentflow("fork", "refund-1", "--app", APP, "--at", "0", "--patch", f'{{"amount": {text}}}')
    # Then each command ends as for any bad argument: exit code 2, one message naming the fix, no traceback
    for result in (decided, forked):
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert said in result.output
    # And nothing was stored
    assert runs_kit.stored(db, "ship-1") == before


def test_an_argument_that_is_not_text_is_refused_before_any_command_reads_it(agentflow, db):
    # Given arguments holding a byte that is not UTF-8 (Python reads it as a lone surrogate)
    for args in (
        ("runs", "show", "ship-\udcff"),
        ("cancel", "refund-1", "--app", APP, "--reason", "sold \udcff out"),
        ("decide", "ship-1", "--app", APP, "--call", "c\udcff=rerun"),
    ):
        result = agentflow(*args)
        # Then the command refuses it as a usage error, naming the argument, and runs nothing
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert "holds a byte that is not UTF-8 text" in result.output and "\\udcff" in result.output
    assert runs_kit.REFUNDS == [] and "paused" in agentflow("runs", "show", "refund-1").stdout
