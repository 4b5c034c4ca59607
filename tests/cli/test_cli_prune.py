"""``agentflow runs prune``: finished runs older than a duration deleted whole, or trimmed (--trim); only when told."""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import pytest
import redis
import runs_kit
from _kit.stores import StoreSetup, run_sql, setups
from runs_kit import one_line_error

from agentflow.cli import _cmd_prune
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.checkpoints.urls import open_store
from agentflow.exec.seal import Sealer

#: The kit's runs: four finished (order-1..3, tamper-1: done), three not (refund-1, refund-2 paused; ship-1 running).
FINISHED = ("order-1", "order-2", "order-3", "tamper-1")
UNFINISHED = ("refund-1", "refund-2", "ship-1")


def counts(db: Path, run_ids: Sequence[str] = FINISHED + UNFINISHED) -> dict[str, tuple[int, int]]:
    return {run_id: runs_kit.stored(db, run_id) for run_id in run_ids}


def test_dry_run_counts_and_deletes_nothing(agentflow, db):
    before = counts(db)
    # When a dry run looks for finished runs older than no time at all
    result = agentflow("runs", "prune", "--older-than", "0s", "--dry-run")
    # Then it counts the four finished runs, and every row is still there
    assert result.exit_code == 0, result.output
    assert "would prune 4 run(s) ended (cancelled, done, failed) and last saved before" in result.stdout
    assert "nothing was deleted" in result.stdout
    assert counts(db) == before


def test_prune_deletes_the_finished_runs_whole_and_leaves_paused_and_running_ones(agentflow, db):
    before = counts(db, UNFINISHED)
    # When the finished runs are pruned (without a question: --yes)
    result = agentflow("runs", "prune", "--older-than", "0s", "--yes", "--batch", "3")
    # Then the four went, every row of them (the tampered one too: its status is read in clear, like the store's rules)
    assert result.exit_code == 0, result.output
    assert "found 4 run(s)" in result.stdout
    assert "pruned 4 run(s)" in result.stdout
    assert "pruning" in result.stderr  # the progress bar's label (no bar: the output is not a terminal)
    assert counts(db, FINISHED) == dict.fromkeys(FINISHED, (0, 0))
    # And the paused and running runs are as they were, and listed
    assert counts(db, UNFINISHED) == before
    listed = agentflow("runs", "list").stdout
    assert all(run_id in listed for run_id in UNFINISHED) and "order-1" not in listed
    # And a pruned run reads as not found
    shown = agentflow("runs", "show", "order-1")
    assert shown.exit_code == 2 and "no run 'order-1'" in one_line_error(shown)


def test_a_run_a_worker_holds_is_left(agentflow, db):
    # Given a finished run whose lease a live worker holds
    runs_kit.hold(db, "order-3")
    # When the finished runs are pruned
    result = agentflow("runs", "prune", "--older-than", "0s", "--yes")
    # Then the other three went, and the held one is whole
    assert "pruned 3 run(s)" in result.stdout
    assert runs_kit.stored(db, "order-3") != (0, 0)
    assert agentflow("runs", "show", "order-3").exit_code == 0


def test_status_and_age_choose_the_runs(agentflow, db):
    before = counts(db)
    # When only failed runs, or only runs older than 30 days, are asked for, Then there are none
    for args in (("--status", "failed"), ("--older-than", "30d")):
        result = agentflow("runs", "prune", "--older-than", "0s", "--yes", *args)
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("no runs to prune: none ended")
    assert counts(db) == before


def test_without_yes_it_asks_and_refuses_when_nobody_can_answer(agentflow, db, monkeypatch):
    before = counts(db)
    # With no terminal to ask on, it refuses (exit 2) and deletes nothing
    refused = agentflow("runs", "prune", "--older-than", "0s")
    assert refused.exit_code == 2
    assert "say --yes to go ahead (no terminal to ask)" in one_line_error(refused)
    # A person who says no: nothing is deleted
    monkeypatch.setattr(_cmd_prune, "_can_ask", lambda: True)
    declined = agentflow("runs", "prune", "--older-than", "0s", input="n\n")
    assert declined.exit_code == 0 and "nothing was pruned" in declined.stdout
    assert "Delete the 4 run(s) ended" in declined.stderr
    assert counts(db) == before
    # A person who says yes: they go
    agreed = agentflow("runs", "prune", "--older-than", "0s", input="y\n")
    assert "pruned 4 run(s)" in agreed.stdout


def test_a_bad_duration_or_status_is_one_line(agentflow):
    for args, said in (
        (("--older-than", "30x"), "--older-than '30x' is not a duration: write a number and a unit, e.g. 30d"),
        (("--older-than", "d"), "is not a duration"),
        (("--older-than", "1d", "--status", "done,running"), "never running or paused ones; got 'running'"),
    ):
        result = agentflow("runs", "prune", "--yes", *args)
        assert result.exit_code == 2
        assert said in one_line_error(result)


def test_durations_parse_to_seconds():
    assert [_cmd_prune.parse_duration(d) for d in ("30d", "12h", "90m", "45s", "2w", "1.5h")] == [
        2_592_000,
        43_200,
        5_400,
        45,
        1_209_600,
        5_400,
    ]


def _url(spec: str) -> str:
    """The --store URL of a store set-up's spec (``redis:URL#PREFIX``, ``sql:URL#TABLE_PREFIX``)."""
    kind, _, rest = spec.partition(":")
    url, _, prefix = rest.rpartition("#")
    return f"{url}?{'prefix' if kind == 'redis' else 'table_prefix'}={prefix}"


async def _two_shipped_one_paused(url: str) -> None:
    store = open_store(url, must_exist=False)
    try:
        runner = runs_kit.app.runner(store, runs_kit.KEY)
        for run_id in ("shipped-1", "shipped-2"):
            await runner.run(runs_kit.shipping, runs_kit.Parcel(address="Porto"), run_id=run_id)
        await runner.run(runs_kit.refunds, runs_kit.Refund(order="o-1", amount=5), run_id="waiting")
    finally:
        await store.aclose()


@pytest.mark.parametrize("store_setup", setups("redis", "sql-postgres"), indirect=True)
def test_prune_on_redis_and_postgres(agentflow, store_setup):
    # Given two finished runs and a paused one on the server
    assert store_setup.spec is not None
    url = _url(store_setup.spec)
    runs_kit.in_thread(lambda: _two_shipped_one_paused(url))
    # When the finished ones are pruned
    result = agentflow("runs", "prune", "--older-than", "0s", "--yes", "--store", url)
    # Then they went and the paused one is listed
    assert "pruned 2 run(s) (10 checkpoint and call rows)" in result.stdout, result.output
    listed = agentflow("runs", "list", "--store", url).stdout
    assert "waiting" in listed and "shipped" not in listed


# -- --trim: keep the runs, delete their older checkpoints --------------------------------


def test_trim_keeps_each_finished_run_with_its_newest_checkpoint_and_its_calls(agentflow, db):
    before = counts(db)
    # When a dry run looks for finished runs to trim, Then it counts the four and deletes nothing
    dry = agentflow("runs", "prune", "--older-than", "0s", "--trim", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would trim 4 run(s) ended (cancelled, done, failed) and last saved before" in dry.stdout
    assert "with older checkpoints to trim (--dry-run: nothing was deleted)" in dry.stdout
    assert counts(db) == before
    # When they are trimmed (without a question: --yes)
    result = agentflow("runs", "prune", "--older-than", "0s", "--trim", "--yes", "--batch", "3")
    # Then each finished run keeps its newest checkpoint and every call record; the others are as they were
    assert result.exit_code == 0, result.output
    rows = sum(before[run_id][0] - 1 for run_id in FINISHED)
    assert (
        f"trimmed 4 run(s) ({rows} checkpoint rows; each kept its newest checkpoint and call records)" in result.stdout
    )
    assert "trimming" in result.stderr
    assert counts(db, FINISHED) == {run_id: (1, before[run_id][1]) for run_id in FINISHED}
    assert counts(db, UNFINISHED) == {run_id: before[run_id] for run_id in UNFINISHED}
    # And a trimmed run is still listed and shown, its history said to start where retention cut it
    assert "order-2" in agentflow("runs", "list").stdout
    shown = agentflow("runs", "show", "order-2")
    step = before["order-2"][0] - 1
    assert shown.exit_code == 0, shown.output
    assert f"checkpoints 0 to {step - 1} were trimmed by retention" in shown.stdout
    # And verify checks what is kept and says the rest was trimmed, not missing
    verified = agentflow("verify", "order-2")
    assert verified.exit_code == 0, verified.output
    assert f"trimmed order-2: checkpoints 0 to {step - 1} were trimmed by retention" in verified.stdout
    assert "(1 run(s) trimmed by retention: their older checkpoints are not stored)" in verified.stdout
    # And nothing is left to trim
    again = agentflow("runs", "prune", "--older-than", "0s", "--trim", "--yes")
    assert again.stdout.startswith("no runs to trim: none ended")


def test_a_trim_also_takes_an_older_tampered_checkpoint_verify_checks_what_is_kept(agentflow, db):
    # Given tamper-1, whose checkpoint 1 was changed behind agentflow's back: verify reports it
    assert agentflow("verify", "tamper-1").exit_code == 1
    # When the finished runs are trimmed, Then that checkpoint went with the others, and verify checks the rest
    agentflow("runs", "prune", "--older-than", "0s", "--trim", "--yes")
    verified = agentflow("verify", "tamper-1")
    assert verified.exit_code == 0 and "trimmed tamper-1" in verified.stdout


def test_a_fork_from_a_trimmed_step_names_the_retention(agentflow, db):
    agentflow("runs", "prune", "--older-than", "0s", "--trim", "--yes")
    assert counts(db, ["tamper-1"])["tamper-1"][0] == 1
    forked = agentflow("fork", "tamper-1", "--app", "runs_kit:app", "--at", "0")
    assert forked.exit_code == 2
    assert "retention trimmed its checkpoints before step" in one_line_error(forked)


def test_trim_asks_and_refuses_when_nobody_can_answer(agentflow, db, monkeypatch):
    before = counts(db)
    refused = agentflow("runs", "prune", "--older-than", "0s", "--trim")
    assert refused.exit_code == 2
    assert "runs prune deletes the older checkpoints of the 4 run(s)" in one_line_error(refused)
    monkeypatch.setattr(_cmd_prune, "_can_ask", lambda: True)
    declined = agentflow("runs", "prune", "--older-than", "0s", "--trim", input="n\n")
    assert declined.exit_code == 0 and "nothing was trimmed" in declined.stdout
    assert counts(db) == before


def _forge_done_and_old(store_setup: StoreSetup, run_id: str, at: float) -> None:
    """Set what the store keeps in clear about `run_id` to "done, saved at `at`" (no key needed: plain writes)."""
    assert store_setup.spec is not None
    kind, _, rest = store_setup.spec.partition(":")
    url, _, prefix = rest.rpartition("#")
    if kind == "redis":
        with redis.Redis.from_url(url) as client:
            client.hset(f"{prefix}:run:{{{run_id}}}:latest", mapping={"status": "done", "saved_at": repr(at)})
            for index in client.scan_iter(match=f"{prefix}:runs*"):
                if client.zscore(index, run_id) is not None:
                    client.zadd(index, {run_id: at})
            client.zrem(f"{prefix}:unfinished:refunds", run_id)
        return
    statement = f"UPDATE {prefix}runs SET status = 'done', saved_at = {at} WHERE run_id = '{run_id}'"
    runs_kit.in_thread(lambda: run_sql(url, statement))


@pytest.mark.parametrize("store_setup", setups("redis", "sql-postgres"), indirect=True)
def test_prune_never_deletes_a_run_whose_clear_fields_were_set_to_done_and_old(agentflow, store_setup):
    # Given a paused refund whose listing someone set to "done" and two days old (no key: two plain writes)
    assert store_setup.spec is not None
    url = _url(store_setup.spec)
    runs_kit.in_thread(lambda: _two_shipped_one_paused(url))
    _forge_done_and_old(store_setup, "waiting", time.time() - 2 * 86_400)
    # When finished runs older than a day are pruned
    result = agentflow("runs", "prune", "--older-than", "1d", "--yes", "--store", url)
    assert result.exit_code == 0, result.output
    # Then the paused refund is still there, whole: its signed newest checkpoint says paused
    shown = agentflow("runs", "show", "waiting", "--store", url)
    assert shown.exit_code == 0 and "paused" in shown.stdout, shown.output


def test_prune_needs_the_checkpoint_key(agentflow, db):
    before = agentflow("runs", "list").stdout
    result = agentflow("runs", "prune", "--older-than", "0s", "--yes", key=None)
    assert result.exit_code != 0 and "AGENTFLOW_CHECKPOINT_KEYS" in result.output
    assert agentflow("runs", "list").stdout == before


def test_a_run_retried_while_the_person_reads_the_question_is_not_pruned(agentflow, db, monkeypatch):
    # Given a failed quote run among the finished ones
    runs_kit.add_failed(db)
    asked = _cmd_prune._go_ahead

    async def retried_meanwhile(deletes: str, yes: bool) -> bool:
        # While the person reads the question, an operator retries quote-1 (a new step, running) and
        # someone without the key sets its listing back to "failed, a day ago" (two plain writes)
        async with SQLiteCheckpointStore(db) as store:
            retried = await runs_kit.quotes_app.runner(store, runs_kit.KEY).retry(
                runs_kit.quotes, "quote-1", max_supersteps=0
            )
            assert retried.status == "running"
        old = time.time() - 86_400
        newest = "step = (SELECT MAX(step) FROM checkpoints WHERE run_id = 'quote-1')"
        for table, where in (("runs", "1 = 1"), ("checkpoints", newest)):  # the listing, the newest row's columns
            statement = f"UPDATE {table} SET status = 'failed', saved_at = {old} WHERE run_id = 'quote-1' AND {where}"
            runs_kit.in_thread(functools.partial(_sqlite, db, statement))
        return await asked(deletes, yes)

    monkeypatch.setattr(_cmd_prune, "_go_ahead", retried_meanwhile)
    # When finished runs are pruned
    result = agentflow("runs", "prune", "--older-than", "0s", "--yes")
    assert result.exit_code == 0, result.output
    # Then the retried run is left whole (its newest row is no longer the one judged), the others went
    assert "pruned 4 run(s)" in result.stdout and "1 run(s) were left" in result.stdout
    assert runs_kit.stored(db, "quote-1")[0] > 0
    assert all(runs_kit.stored(db, run_id) == (0, 0) for run_id in FINISHED)


def test_a_retry_moved_aside_by_two_updates_is_left_and_named(agentflow, db):
    # Given a failed quote run, retried since: the retry claimed it and logged a call as started, then died
    runs_kit.add_failed(db)

    async def retry_in_doubt() -> int:
        async with SQLiteCheckpointStore(db) as store:
            runner = runs_kit.quotes_app.runner(store, runs_kit.KEY)
            await runner.retry(runs_kit.quotes, "quote-1", max_supersteps=0)
            claim = await store.latest("quote-1")
            started = Sealer(runs_kit.KEY).seal_call("quote-1", claim.segment, 0, "started", {"tool": "quote"})
            await store.record_call("quote-1", started)
            return claim.step

    claimed = runs_kit.in_thread(retry_in_doubt)
    # And someone without the key moved the retry's checkpoint aside with two UPDATEs and no DELETE: its step set
    # back by 1000, the runs row pointed at the failed row again
    failed_at = f"(SELECT saved_at FROM checkpoints WHERE run_id = 'quote-1' AND step = {claimed - 1})"
    for statement in (
        f"UPDATE checkpoints SET step = step - 1000 WHERE run_id = 'quote-1' AND step >= {claimed}",
        f"UPDATE runs SET step = {claimed - 1}, status = 'failed', saved_at = {failed_at} WHERE run_id = 'quote-1'",
    ):
        runs_kit.in_thread(functools.partial(_sqlite, db, statement))
    records = runs_kit.stored(db, "quote-1")[1]
    # When finished runs are pruned
    result = agentflow("runs", "prune", "--older-than", "0s", "--yes")
    # Then the others went and quote-1 is left with its in-doubt call, named with why
    assert result.exit_code == 0, result.output
    assert "pruned 4 run(s)" in result.stdout
    assert f"left run quote-1: its call log holds 1 record(s) of segment {claimed}" in result.stdout
    assert runs_kit.stored(db, "quote-1")[1] == records


async def _sqlite(db: Path, statement: str) -> None:
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(statement)
