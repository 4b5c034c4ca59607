"""The reading commands read a store (``--store``) or a deployment's (``--workers``).

``runs list``, ``runs show``, ``verify`` and ``events`` alike: with ``--workers
MODULE:ATTR`` (or ``$AGENTFLOW_WORKERS``) the deployment's settings give the store, the
key ring and the flows, as for the acting commands; an option naming this process's own
store, key or flows beside it is refused. Reading a real deployment's store is in
tests/cli/test_cli_workers.py.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result
from runs_kit import one_line_error

from agentflow.cli._group import cli

#: Each reading command, with the arguments it needs.
READERS = [["runs", "list"], ["runs", "show", "r-1"], ["verify", "--all"], ["events", "r-1"]]
IDS = ["runs-list", "runs-show", "verify", "events"]


def run(args: list[str], **env: str | None) -> Result:
    return CliRunner().invoke(cli, args, env={"AGENTFLOW_STORE": None, "AGENTFLOW_WORKERS": None, **env})


@pytest.mark.parametrize("reader", READERS, ids=IDS)
def test_workers_and_store_exclude_each_other(reader: list[str]) -> None:
    result = run([*reader, "--workers", "w:t", "--store", "sqlite:///x.db"])
    assert result.exit_code == 2, result.output
    assert (
        "--store names a store to read, --workers reads the deployment's store with its key ring and flows: "
        "give one or the other"
    ) in result.stderr


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--key-env", "MY_KEYS"], "--key-env names a key to read with, --workers reads"),
        (["--app", "runs_kit:app"], "--app names the flows to read with, --workers reads"),
    ],
    ids=["key-env", "app"],
)
def test_a_key_or_flows_of_this_process_beside_workers_are_refused(option: list[str], says: str) -> None:
    result = run(["runs", "list", "--workers", "w:t", *option])
    assert result.exit_code == 2 and says in result.stderr


def test_workers_from_the_environment_refuse_a_store_on_the_command_line() -> None:
    result = run(["verify", "--all", "--store", "sqlite:///x.db"], AGENTFLOW_WORKERS="w:t")
    assert result.exit_code == 2
    assert "--store names a store to read, $AGENTFLOW_WORKERS reads the deployment's store" in result.stderr


def test_with_workers_the_store_in_the_environment_is_not_read() -> None:
    # Given $AGENTFLOW_STORE set, When the command names workers, Then it goes to the workers (here: a bad path)
    result = run(["runs", "list", "--workers", "no_such_module:tasks"], AGENTFLOW_STORE="sqlite:///x.db")
    assert result.exit_code == 2
    assert "cannot import 'no_such_module'" in one_line_error(result)


def test_neither_store_nor_workers_says_how_to_name_one() -> None:
    result = run(["runs", "show", "r-1"])
    assert result.exit_code == 2
    assert "give --store URL (or $AGENTFLOW_STORE), or --workers MODULE:ATTR to read the deployment's store" in (
        result.stderr
    )
