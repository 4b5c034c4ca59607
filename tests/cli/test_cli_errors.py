"""User mistakes end with one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest
import runs_kit
from runs_kit import one_line_error

from agentflow.exec.seal import key_id

WRONG_KEY = "another-key-that-signed-nothing-here-0123"


@pytest.mark.parametrize(
    "key",
    [
        runs_kit.KEY.decode(),
        "hex:" + runs_kit.KEY.hex(),
        "base64:" + base64.b64encode(runs_kit.KEY).decode(),
        f"{WRONG_KEY}, hex:{runs_kit.KEY.hex()}",  # rotation: the old key still checks old rows
    ],
    ids=["text", "hex", "base64", "rotation"],
)
def test_every_key_form_is_read(agentflow, key):
    assert agentflow("verify", "order-1", key=key).exit_code == 0


def test_a_wrong_key_is_one_line_and_never_printed(agentflow):
    result = agentflow("runs", "list", "--strict", key=WRONG_KEY)
    assert result.exit_code == 1
    line = one_line_error(result)
    assert "7 of 7 run(s) have rows that fail their check" in line and "AGENTFLOW_CHECKPOINT_KEYS" in line
    assert WRONG_KEY not in result.output and runs_kit.KEY.decode() not in result.output


def test_a_wrong_key_on_show_names_the_variable_and_each_key_id_for_what_it_is(agentflow):
    result = agentflow("runs", "show", "order-1", key=WRONG_KEY)
    assert result.exit_code == 2
    line = one_line_error(result)
    assert f"run 'order-1' is signed with key id {key_id(runs_kit.KEY)}" in line
    assert f"$AGENTFLOW_CHECKPOINT_KEYS holds key id {key_id(WRONG_KEY.encode())}" in line


@pytest.mark.parametrize(
    ("key", "says"),
    [
        (None, "the checkpoint key is not set"),
        ("too-short", "$AGENTFLOW_CHECKPOINT_KEYS has 9 bytes"),
        ("hex:zz", "not valid hex"),
        ("base64:***", "not valid base64"),
    ],
)
def test_a_missing_or_bad_key_is_one_line(agentflow, key, says):
    result = agentflow("runs", "list", key=key)
    assert result.exit_code == 2
    line = one_line_error(result)
    assert says in line
    if key:
        assert key not in line.replace("$AGENTFLOW_CHECKPOINT_KEYS", "")


def test_key_env_names_another_variable(agentflow):
    result = agentflow("runs", "list", "--key-env", "MY_KEY", key=None, env={"MY_KEY": runs_kit.KEY_TEXT})
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://db/x", "not a store URL"),
        ("runs.db", "not a store URL"),
        ("sqlite://host/runs.db", "three slashes"),
        ("sqlite:///:memory:", "in-memory"),
        ("postgresql://u@h/db", "postgresql+asyncpg://"),
        ("sqlite:////no/such/dir/runs.db", "there is no database file"),
    ],
)
def test_a_bad_store_url_is_one_line_naming_the_accepted_forms(agentflow, url, says):
    result = agentflow("runs", "list", "--store", url)
    assert result.exit_code == 2
    line = one_line_error(result)
    assert says in line
    if "no database file" not in says:
        assert "sqlite:////abs/path.db" in line and "redis://" in line


def test_a_password_in_a_bad_url_is_not_shown(agentflow):
    line = one_line_error(agentflow("runs", "list", "--store", "postgres://me:hunter2@db/x"))
    assert "hunter2" not in line and "me:***@" in line


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:1/0?prefix=t", "postgresql+asyncpg://nobody@127.0.0.1:1/nothing"],
    ids=["redis", "postgres"],
)
def test_an_unreachable_server_is_one_line(agentflow, url):
    result = agentflow("runs", "list", "--store", url)
    assert result.exit_code == 2
    assert "reach" in one_line_error(result)


def test_the_installed_command_prints_no_traceback(url):
    # The real console script, in its own process
    script = Path(sys.executable).parent / "agentflow"
    env = {"AGENTFLOW_CHECKPOINT_KEYS": runs_kit.KEY_TEXT, "PATH": "/usr/bin:/bin", **runs_kit.ALLOW_DEMO_KEY}
    proc = subprocess.run(
        [str(script), "runs", "show", "nope", "--store", url], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "agentflow: no run 'nope' in this store"
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_file_that_is_not_a_database_is_one_line(agentflow, tmp_path):
    (tmp_path / "notes.db").write_text("not a database")
    result = agentflow("runs", "list", "--store", f"sqlite:///{tmp_path / 'notes.db'}")
    assert result.exit_code == 2
    assert "is not an SQLite database" in one_line_error(result)
