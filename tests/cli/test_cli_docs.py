"""Every ``agentflow`` command line written in docs/ parses against the CLI as it is.

The pages show commands in ```sh blocks (what to type) and ```text blocks (a transcript:
``$ agentflow ...`` lines followed by output). Their apps and stores are the reader's
(``my_company.agents:app``), so they are not run here (the behaviour of each command is
tested in this folder); what is checked is that each line names a command that exists,
with options it takes and arguments it accepts, so no page drifts from the CLI.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from agentflow.cli._group import cli

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"```(sh|text|bash)\n(.*?)```", re.S)


def command_lines() -> list[tuple[str, int, str]]:
    """``(page, line, command)`` of each agentflow command in a shell block or a transcript."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for fence in FENCE.finditer(text):
            start = text[: fence.start(2)].count("\n") + 1
            joined = fence.group(2).replace("\\\n", " ")  # a continued line is one command
            for offset, raw in enumerate(joined.splitlines()):
                line = raw.strip()
                if fence.group(1) == "text":  # a transcript: only what was typed
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                if re.match(r"(\S+=\S+\s+)*agentflow\s", line + " ") and not line.startswith("agentflow:"):
                    found.append((str(page.relative_to(DOCS)), start + offset, line))
    return found


def parse(line: str) -> None:
    """Parse one command line down to its subcommand, running none of it.

    Raises:
        click.UsageError: the line does not fit the CLI.
    """
    words = shlex.split(line, comments=True)
    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value before the command
        words.pop(0)
    assert words[0] == "agentflow", line
    rest = [w for w in words[1:] if w not in ("<", "/dev/null", ">", "|")]
    command: click.Command = cli
    ctx = click.Context(cli, info_name="agentflow")
    name = "agentflow"
    while isinstance(command, click.Group):
        if not rest:
            raise click.UsageError(f"{name}: a subcommand is missing")
        name, *rest = rest
        found = command.get_command(ctx, name)
        if found is None:
            raise click.UsageError(f"no command {name!r}")
        command = found
        ctx = click.Context(command, info_name=name, parent=ctx)
    command.make_context(name, rest, parent=ctx.parent, resilient_parsing=False)


LINES = command_lines()


def test_the_docs_show_the_operator_commands():
    typed = " ".join(line for _, _, line in LINES)
    commands = ("recover", "resume", "decide", "retry", "cancel", "fork", "runs list", "verify", "events", "viewer")
    for command in commands:
        assert f"agentflow {command}" in typed, command


@pytest.mark.parametrize(("page", "line", "command"), LINES, ids=[f"{p}:{n}" for p, n, _ in LINES])
def test_a_documented_command_line_parses(page, line, command, monkeypatch):
    # The pages set the store once for a session (``export AGENTFLOW_STORE=...``).
    monkeypatch.setenv("AGENTFLOW_STORE", "sqlite:///runs.db")
    try:
        parse(command)
    except click.UsageError as exc:
        pytest.fail(f"{page}:{line}: {command!r} does not fit the CLI: {exc}")


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The path of every command under `group` (its own included)."""
    found = [path]
    for name, command in group.commands.items():
        found += _commands(command, (*path, name)) if isinstance(command, click.Group) else [(*path, name)]
    return found


@pytest.mark.parametrize("path", _commands(cli), ids=lambda p: " ".join(p) or "agentflow")
def test_help_shows_no_raw_markup(path: tuple[str, ...]) -> None:
    # A docstring written for the API docs (``x``, `x`, **x**) reads as noise in a terminal
    result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert not re.search(r"``|`[^`\s][^`]*`|\*\*|:(class|func|meth):", result.output), result.output
