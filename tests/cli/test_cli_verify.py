"""``agentflow verify``: every signature and every number, one run or all of them."""

from __future__ import annotations

import secrets
import sqlite3
from contextlib import closing

import runs_kit
from runs_kit import one_line_error


def test_verify_all_finds_the_tampered_row_and_exits_1(agentflow):
    # Given a store where one byte of tamper-1's checkpoint 1 was changed with sqlite3
    # When every run is verified
    result = agentflow("verify", "--all")
    # Then the run and the row are named, and the exit code says something is wrong
    assert result.exit_code == 1
    assert "CORRUPT tamper-1: checkpoint 1 of run 'tamper-1': signature does not match" in result.stdout
    assert "1 of 7 run(s) have rows that fail their check" in one_line_error(result)
    assert "order-1" not in result.stdout


def test_verify_one_clean_run_counts_what_it_checked(agentflow):
    result = agentflow("verify", "order-2")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok: 1 run(s), 5 checkpoints and 7 call records")


def test_verify_all_on_a_clean_store_exits_0(agentflow, db):
    with closing(sqlite3.connect(db)) as conn, conn:
        for table in ("checkpoints", "runs", "calls"):
            conn.execute(f"DELETE FROM {table} WHERE run_id = 'tamper-1'")
    result = agentflow("verify", "--all")
    assert result.exit_code == 0, result.output
    assert "ok: 6 run(s)" in result.stdout


def test_verify_finds_a_record_deleted_from_the_middle_of_the_log(agentflow, db):
    # Given order-1's call record 0.1 (hold_seats done) deleted behind agentflow's back
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DELETE FROM calls WHERE run_id = 'order-1' AND segment = 0 AND seq = 1")
    result = agentflow("verify", "order-1")
    assert result.exit_code == 1
    assert "record 0.1 is missing" in result.stdout


def test_verify_finds_a_changed_call_result(agentflow, db):
    with closing(sqlite3.connect(db)) as conn, conn:
        (payload,) = conn.execute("SELECT payload FROM calls WHERE run_id='order-3' AND seq=3").fetchone()
        conn.execute(
            "UPDATE calls SET payload = ? WHERE run_id='order-3' AND seq=3", (payload.replace(b"EUR", b"USD"),)
        )
    result = agentflow("verify", "order-3")
    assert result.exit_code == 1
    assert "call record 0.3 of run 'order-3': signature does not match" in result.stdout


def test_verify_needs_a_run_or_all(agentflow):
    result = agentflow("verify")
    assert result.exit_code == 2
    assert "give a RUN_ID or --all" in result.stderr and "Traceback" not in result.output


def test_verify_with_the_wrong_key_says_so(agentflow):
    result = agentflow("verify", "order-1", key="hex:" + secrets.token_hex(32))
    assert result.exit_code == 1
    line = one_line_error(result)
    assert "is signed with key id" in line and "give the key the workers sign with" in line
    assert runs_kit.KEY.hex() not in result.output


def test_verify_all_reports_a_run_the_listing_index_forgot(agentflow, db):
    # Given order-2's entry in the listing index (its runs row) deleted behind agentflow's back
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DELETE FROM runs WHERE run_id = 'order-2'")
    # When every run is verified
    result = agentflow("verify", "--all")
    # Then the run is found from its rows and named, with what hides it
    assert result.exit_code == 1
    assert "CORRUPT order-2: run 'order-2' has stored rows but is missing from the store's listing index" in (
        result.stdout
    )
    assert "2 of 7 run(s) have rows that fail their check" in one_line_error(result)


def test_verify_reports_a_copy_in_a_run_s_event_stream(agentflow, db):
    # Given a byte copy of refund-1's first event entry appended to its stream (its rows untouched)
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "INSERT INTO events (run_id, payload, kid, sig) SELECT run_id, payload, kid, sig FROM events "
            "WHERE run_id = 'refund-1' ORDER BY id LIMIT 1"
        )
    # When the run is verified
    result = agentflow("verify", "refund-1")
    # Then the stream's problem is an EVENTS line, the exit code 1, and the run is not called corrupt
    assert result.exit_code == 1
    assert "EVENTS refund-1:" in result.stdout and "a copy of an event already read" in result.stdout
    assert "CORRUPT" not in result.stdout and "event stream of 1 run(s) does not check" in one_line_error(result)
