"""Issue 15, item 7: a run that fails its check does not hide the good ones.

Finding reproduced: one run written with another key made ``agentflow runs list`` print
nothing but an error and exit 2, naming the key id of the key given as if it were the run's.
"""

from __future__ import annotations

from pathlib import Path

import runs_kit
from runs_kit import one_line_error

from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.run.markers import Markers
from agentflow.exec.run.quarantine import QUARANTINED, mark
from agentflow.exec.seal import Sealer, key_id

OTHER_KEY = runs_kit.ALIEN_KEY
GOOD = {"order-1", "order-2", "order-3", "refund-1", "refund-2", "ship-1"}
add_alien = runs_kit.add_alien


def rows(output: str) -> dict[str, str]:
    return {line.split()[0]: line for line in output.splitlines()[1:] if line.strip() and "run(s)" not in line}


def test_list_shows_every_run_and_marks_the_one_signed_with_another_key(agentflow, db):
    # Given the kit's good runs, the tampered one, and a run signed with another key
    add_alien(db)
    # When they are listed
    result = agentflow("runs", "list")
    # Then every run is listed and the command succeeds
    assert result.exit_code == 0, result.output
    listed = rows(result.stdout)
    assert set(listed) == GOOD | {"tamper-1", "alien-1"}
    assert all("CORRUPT" not in listed[run] for run in GOOD)
    # and the alien run is marked with the key id its rows carry, not the one given
    assert f"CORRUPT: signed with key id {key_id(OTHER_KEY)}" in listed["alien-1"]
    assert key_id(runs_kit.KEY) not in listed["alien-1"] and "Oslo" not in result.output
    # and one line on stderr counts the runs that fail, naming each key id for what it is
    line = one_line_error(result)
    assert "2 of 8 run(s) have rows that fail their check" in line
    assert f"run 'alien-1' is signed with key id {key_id(OTHER_KEY)}" in line
    assert f"$AGENTFLOW_CHECKPOINT_KEYS holds key id {key_id(runs_kit.KEY)}" in line


def test_list_strict_exits_1_when_a_run_fails_its_check(agentflow, db):
    # Given a run signed with another key among good ones
    add_alien(db)
    # When they are listed with --strict
    result = agentflow("runs", "list", "--strict")
    # Then every run is still listed, and the exit code says some failed
    assert result.exit_code == 1
    assert set(rows(result.stdout)) == GOOD | {"tamper-1", "alien-1"}
    assert "2 of 8 run(s) have rows that fail their check" in one_line_error(result)


def test_list_strict_exits_0_when_every_run_checks(agentflow, db):
    # Given a store whose runs all check (the tampered one deleted)
    runs_kit.in_thread(lambda: _delete(db, "tamper-1"))
    # When listed with --strict, Then it succeeds with nothing on stderr
    result = agentflow("runs", "list", "--strict")
    assert result.exit_code == 0, result.output
    assert result.stderr == "" and set(rows(result.stdout)) == GOOD


async def _delete(db: Path, run_id: str) -> None:
    async with SQLiteCheckpointStore(db) as store:
        await store.delete(run_id)


def test_list_with_the_wrong_key_lists_every_run_marked_and_says_which_key_signed_them(agentflow):
    # Given a key that signed none of the runs
    wrong = b"a-key-that-signed-nothing-in-this-store-01"
    # When the runs are listed with it
    result = agentflow("runs", "list", key="hex:" + wrong.hex())
    # Then every run is listed as CORRUPT with its rows' key id, and stderr says which key the runs need
    assert result.exit_code == 0
    listed = rows(result.stdout)
    assert len(listed) == 7 and all(f"signed with key id {key_id(runs_kit.KEY)}" in row for row in listed.values())
    line = one_line_error(result)
    assert f"$AGENTFLOW_CHECKPOINT_KEYS holds key id {key_id(wrong)}" in line
    assert "give the key the workers sign with" in line


def test_show_and_verify_name_the_rows_key_id_as_the_runs(agentflow, db):
    # Given a run signed with another key
    add_alien(db)
    for args in (("runs", "show", "alien-1"), ("verify", "alien-1")):
        # When it is shown or verified
        result = agentflow(*args)
        # Then the run's key id is the one its rows carry, and the key given is named as the variable's
        assert result.exit_code in (1, 2)
        line = one_line_error(result)
        assert f"run 'alien-1' is signed with key id {key_id(OTHER_KEY)}" in line
        assert f"$AGENTFLOW_CHECKPOINT_KEYS holds key id {key_id(runs_kit.KEY)}" in line


def test_verify_shows_that_recover_all_quarantined_the_run(agentflow, db):
    # Given a run signed with another key, which a worker's recover_all quarantined
    add_alien(db)

    async def quarantine() -> None:
        async with SQLiteCheckpointStore(db) as store:
            assert await mark(Markers(store, Sealer(runs_kit.KEY)), "alien-1", QUARANTINED, "agentflow@w1:42")

    runs_kit.in_thread(quarantine)
    # When every run is verified
    result = agentflow("verify", "--all")
    # Then the run is named with its problem, and as quarantined by that worker, with how to release it
    assert result.exit_code == 1
    assert f"CORRUPT alien-1: checkpoint 0 of run 'alien-1' is signed with key id {key_id(OTHER_KEY)!r}" in (
        result.stdout
    )
    assert "QUARANTINED alien-1: recover_all reported it at " in result.stdout
    assert "(agentflow@w1:42)" in result.stdout and "add the key that signed them" in result.stdout
    assert "QUARANTINED tamper-1" not in result.stdout


def test_verify_does_not_believe_a_quarantine_marker_nobody_with_the_key_set(agentflow, db):
    # Given a run signed with another key, and a quarantine marker written by someone without the workers' key
    add_alien(db)

    async def forge() -> None:
        async with SQLiteCheckpointStore(db) as store:
            assert await mark(Markers(store, Sealer(OTHER_KEY)), "alien-1", QUARANTINED, "mallory@w1:42")

    runs_kit.in_thread(forge)
    # When every run is verified
    result = agentflow("verify", "--all")
    # Then the run is reported as failing its check, but not as quarantined by anyone
    assert result.exit_code == 1 and "CORRUPT alien-1" in result.stdout
    assert "QUARANTINED" not in result.stdout and "mallory" not in result.stdout
