"""The CLI's key: the demo's public key only when asked for, no weak key, and no secret in a repr.

Issue 16: the public demo key was accepted as any other, ``"a" * 32`` was accepted, 64 hex
digits without ``hex:`` silently became 64 ASCII bytes, and the CLI's target object showed
the raw checkpoint key in its repr.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import pytest
import runs_kit
from click.testing import Result
from runs_kit import one_line_error

from agentflow._keys import MAKE_ONE
from agentflow.cli._target import Target, open_target
from agentflow.exec.checkpoints import MemoryCheckpointStore

NO_FLAG: dict[str, str | None] = {"AGENTFLOW_ALLOW_DEMO_KEY": None}
#: The ``agentflow`` fixture (tests/cli/cli_fixtures.py): runs the command in-process.
Run = Callable[..., Result]


@pytest.mark.parametrize("command", [["runs", "list"], ["runs", "show", "order-1"], ["verify", "--all"]])
def test_the_demo_key_is_refused_unless_the_command_is_told(agentflow: Run, command: list[str]) -> None:
    # Given the store's runs signed with the demo's public key, and that key in the variable
    # When a command runs without --allow-demo-key
    refused = agentflow(*command, env=NO_FLAG)
    # Then it stops in one line that says why and how to look at the demo's runs anyway
    assert refused.exit_code == 2
    line = one_line_error(refused)
    assert "$AGENTFLOW_CHECKPOINT_KEYS is the demo's public key" in line and "--allow-demo-key" in line
    assert runs_kit.KEY.hex() not in refused.output and runs_kit.KEY.decode() not in refused.output
    # and with the flag, or the variable set to 1, it reads the demo's runs
    assert agentflow(*command, "--allow-demo-key", env=NO_FLAG).exit_code in (0, 1)
    assert agentflow(*command, env={"AGENTFLOW_ALLOW_DEMO_KEY": "1"}).exit_code in (0, 1)
    assert agentflow(*command, env={"AGENTFLOW_ALLOW_DEMO_KEY": "0"}).exit_code == 2


def test_the_demo_key_is_refused_by_the_acting_commands_and_the_viewer(agentflow: Run) -> None:
    for command in (
        ["recover", "ship-1", "--app", "runs_kit:app"],
        ["resume", "refund-1", "--app", "runs_kit:app", "--approve"],
        ["viewer", "--port", "0"],
    ):
        result = agentflow(*command, env=NO_FLAG)
        assert result.exit_code == 2, command
        assert "the demo's public key" in one_line_error(result)
    assert runs_kit.REFUNDS == []


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("a" * 32, "is one byte repeated"),
        ("hex:" + "00" * 32, "is one byte repeated"),
        ("abcdefgh" * 5, "only 8 distinct byte values"),
        (secrets.token_hex(32), "64 hex digits without a prefix"),
    ],
    ids=["one-byte", "one-byte-hex", "eight-values", "bare-hex"],  # fixed ids: the same on every collection
)
def test_weak_or_ambiguous_keys_are_refused_in_one_line_that_never_shows_them(
    agentflow: Run, key: str, says: str
) -> None:
    result = agentflow("runs", "list", key=key)
    assert result.exit_code == 2
    line = one_line_error(result)
    assert says in line and MAKE_ONE in line
    secret = key.partition(":")[2] or key
    assert secret[:8] not in line and secret[-8:] not in line


def test_the_target_shows_no_key_and_no_password(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a key in the environment and a store URL with a password
    key = secrets.token_hex(32)
    monkeypatch.setenv("MY_KEY", "hex:" + key)
    target = open_target("redis://:hunter2-secret@127.0.0.1:1/0?prefix=t", "MY_KEY")
    # Then neither repr nor str shows the key or the password, and both say what the target is
    for text in (repr(target), str(target), f"{target}", repr([target])):
        assert key not in text and repr(bytes.fromhex(key)) not in text and "hunter2" not in text
    assert "redis://:***@127.0.0.1:1/0?prefix=t" in repr(target) and "MY_KEY" in repr(target)
    assert target.keys == [bytes.fromhex(key)]  # the keys are still there for the commands


def test_a_target_built_by_hand_hides_its_keys_too() -> None:
    key = secrets.token_bytes(32)
    target = Target(MemoryCheckpointStore(), [key], "K")
    assert repr(key) not in repr(target) and key.hex() not in repr(target)
    assert "MemoryCheckpointStore" in repr(target)
