"""``agentflow verify``: every signature and every number, one run or all of them."""

from __future__ import annotations

import functools
import secrets
import sqlite3
from contextlib import closing

import pytest
import redis
import runs_kit
from runs_kit import one_line_error

from agentflow.exec.checkpoints.urls import open_store


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


def test_verify_names_a_checkpoint_row_deleted_behind_the_listing(agentflow, db):
    # Given order-2's newest checkpoint row deleted with sqlite3, its runs row left as it was
    with closing(sqlite3.connect(db)) as conn, conn:
        (step,) = conn.execute("SELECT MAX(step) FROM checkpoints WHERE run_id = 'order-2'").fetchone()
        conn.execute("DELETE FROM checkpoints WHERE run_id = 'order-2' AND step = ?", (step,))
    # When the run is verified
    result = agentflow("verify", "order-2")
    # Then the removal is named (the rows left check on their own), and the exit code says so
    assert result.exit_code == 1
    assert (
        f"CORRUPT order-2: checkpoint rows of run 'order-2' were removed: the store's listing entry of run "
        f"'order-2' names checkpoint {step} (done), but the newest stored row is step {step - 1}"
    ) in result.stdout
    assert "1 of 1 run(s) have rows that fail their check" in one_line_error(result)


async def _ship(url: str, run_id: str) -> None:
    store = open_store(url, must_exist=False)
    try:
        await runs_kit.app.runner(store, runs_kit.KEY).run(runs_kit.shipping, {"address": "Porto"}, run_id=run_id)
    finally:
        await store.aclose()


@pytest.mark.redis
def test_verify_names_what_redis_writes_erased(agentflow, redis_url, unique_prefix):
    prefix = unique_prefix()
    url = f"{redis_url}?prefix={prefix}"
    client = redis.Redis.from_url(redis_url)
    try:
        # Given two finished shipping runs on the real server
        for run_id in ("s-1", "s-2"):
            runs_kit.in_thread(functools.partial(_ship, url, run_id))
        # When s-1's newest checkpoint row is trimmed off (LTRIM) and its record counter set back (HSET),
        # and s-2's oldest row is trimmed off
        key = f"{prefix}:run:{{s-1}}"
        steps = client.llen(f"{key}:cp")
        client.ltrim(f"{key}:cp", 0, -2)
        client.hset(f"{key}:next", "0", 1)
        client.ltrim(f"{prefix}:run:{{s-2}}:cp", 1, -1)
        # Then verify names each write, run by run, with no traceback, and exits 1
        result = agentflow("verify", "--all", "--store", url)
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert (
            f"CORRUPT s-1: checkpoint rows of run 's-1' were removed: the store's listing entry of run 's-1' "
            f"names checkpoint {steps - 1} (done), but the newest stored row is step {steps - 2} (running)"
        ) in result.stdout
        assert "CORRUPT s-1: call log of run 's-1': segment 0's record counter was set back to 1" in result.stdout
        assert "CORRUPT s-2: run 's-2': checkpoint row 0 holds step 1" in result.stdout
        assert "2 of 2 run(s) have rows that fail their check" in one_line_error(result)
    finally:
        for found in client.scan_iter(match=f"{prefix}*"):
            client.delete(found)
        client.close()
