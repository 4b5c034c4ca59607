"""Every command a message of agentflow's tells an operator to run exists, and none reruns an effect unasked.

The hints are found in the source itself (every string of agentflow/, f-strings with their
placeholders as ``X``), so a hint added anywhere (the CLI, the viewer, the workers' logs, an
error's text) is checked without a list to keep: each ``agentflow <command> ...`` must name a
command of the CLI, and each ``--option`` after it an option of that command. And no hint says
``--rerun-in-doubt``: a call in doubt may have had its effect, so the only command a hint gives
for it is ``agentflow decide``, which asks what happened per call.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest

from agentflow._hints import decide_hint
from agentflow.cli._group import cli

PACKAGE = Path(__file__).resolve().parents[2] / "agentflow"
#: ``agentflow`` then a command word: a hint (the demo's own narrated commands are its story, not hints;
#: a word no command has, followed by prose, is prose: "agentflow keeps ...").
_HINT = re.compile(r"agentflow ((?:runs )?[a-z][a-z-]+)((?: +(?:--[a-z-]+|[^ ,;:()`'\"]+))*)")
#: Words after ``agentflow`` that are prose, not a command.
_PROSE = {"demo", "worker", "metrics", "command", "commands", "decide:", "runs"}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of `tree` (prose, not messages)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant and f-string of `path` but docstrings (placeholders as ``X``), with its line."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    prose = _docstrings(tree)
    prose |= {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if id(node) in prose:  # a docstring, or a piece of an f-string (read whole)
            continue
        if isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) if isinstance(v, ast.Constant) else "X" for v in node.values)
            found.append((node.lineno, str(text)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def _texts(path: Path) -> list[tuple[int, str]]:
    """The texts of `path` a message may come from: a module's strings, a page template's lines."""
    if path.suffix == ".py":
        return _strings(path)
    return [(n, re.sub(r"<[^>]+>", "", line)) for n, line in enumerate(path.read_text().splitlines(), 1)]


def _hints() -> list[tuple[str, str, list[str]]]:
    """(where, command, its options) for every ``agentflow <command> ...`` in a message of the package."""
    hints = []
    for path in sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.html")]):
        if "demo" in path.parts:
            continue
        for line, text in _texts(path):
            for match in _HINT.finditer(text):
                command, rest = match.group(1), match.group(2).split()
                if command in _PROSE or command.split()[-1] in _PROSE:
                    continue
                # A command is followed by what it acts on (RUN_ID, X, --an-option) or is one: else prose.
                if _command(command) is None and not (rest and (rest[0].startswith("--") or rest[0].isupper())):
                    continue
                options = re.findall(r"--[a-z-]+", match.group(2))
                hint = (f"{path.relative_to(PACKAGE.parent)}:{line}", command, options)
                if hint not in hints:
                    hints.append(hint)
    return hints


def _command(name: str) -> click.Command | None:
    found: click.Command | None = cli
    for word in name.split():
        if not isinstance(found, click.Group):
            return None
        found = found.commands.get(word)
    return found


def _options(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in [*param.opts, *param.secondary_opts] if opt.startswith("--")}


HINTS = _hints()


def test_the_source_holds_hints_to_check() -> None:
    # The scan finds the hints it is meant to: the decision hint of `runs show` and the viewer among them.
    assert len(HINTS) >= 10 and any(command == "decide" for _, command, _ in HINTS), HINTS


@pytest.mark.parametrize(("where", "command", "options"), HINTS, ids=[h[0] for h in HINTS])
def test_every_hint_names_a_command_and_options_that_exist(where: str, command: str, options: list[str]) -> None:
    found = _command(command)
    assert found is not None, f"{where}: hint names `agentflow {command}`, which is no command"
    unknown = set(options) - _options(found) - {"--help"}
    assert not unknown, f"{where}: `agentflow {command}` has no option {sorted(unknown)}"


def test_no_hint_tells_an_operator_to_rerun_calls_in_doubt() -> None:
    told = [(where, command) for where, command, options in HINTS if "--rerun-in-doubt" in options]
    assert not told, f"hints that would rerun calls in doubt unasked: {told}"


@pytest.mark.parametrize("workers", [None, "workers.celery_app:tasks", "..."])
def test_the_decision_hint_asks_per_call_and_parses_as_a_command(workers: str | None) -> None:
    hint = decide_hint("run-1", workers=workers)
    assert "--rerun-in-doubt" not in hint and "--call CALL_ID=rerun|happened:JSON|not:REASON" in hint
    first = hint.split(", then ")[0].split()
    assert first[:3] == ["agentflow", "decide", "run-1"]
    decide = _command("decide")
    assert decide is not None
    given = {word for word in first if word.startswith("--")}
    assert given <= _options(decide), given - _options(decide)
    assert ("--workers" in given) == (workers is not None) and ("--app" in given) == (workers is None)


#: The classes a message may point an operator or a developer at, by the name it uses.
_API = re.compile(r"\b(FlowClient|FlowRunner|LoopRunner|AgentRunner|DurableAgent|FlowApp|Registry)\.([a-z_]+)\b")


def _api_hints() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _strings(path):
            for match in _API.finditer(text):
                hint = (f"{path.relative_to(PACKAGE.parent)}:{line}", match.group(1), match.group(2))
                if hint not in found:
                    found.append(hint)
    return found


API_HINTS = _api_hints()


@pytest.mark.parametrize(("where", "owner", "name"), API_HINTS, ids=[f"{h[0]}-{h[1]}.{h[2]}" for h in API_HINTS])
def test_every_method_a_message_names_exists(where: str, owner: str, name: str) -> None:
    from agentflow import FlowApp, Registry
    from agentflow.celery import FlowClient
    from agentflow.exec import LoopRunner
    from agentflow.flow import FlowRunner
    from agentflow.integrations.pydantic_ai import AgentRunner, DurableAgent

    classes = {
        c.__name__: c for c in (FlowClient, FlowRunner, LoopRunner, AgentRunner, DurableAgent, FlowApp, Registry)
    }
    assert hasattr(classes[owner], name), f"{where}: a message names {owner}.{name}, which does not exist"
