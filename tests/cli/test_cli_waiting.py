"""A command that waits for a run says so on stderr: which run, for what, and each change of its status.

On a terminal a spinner shows how the run stands meanwhile. Here the command runs the run
itself (its tools in this process); through ``--workers`` it waits for a worker
(tests/cli/test_cli_workers.py). stdout keeps the command's result only.
"""

from __future__ import annotations

import runs_kit
from _kit.poll import until
from runs_kit import one_line_error

from agentflow.cli._progress import Progress
from agentflow.cli._text import ERASE_LINE

APP = "runs_kit:app"


def test_a_command_running_the_run_here_says_which_run_it_waits_for_and_each_change_of_status(agentflow):
    # When the operator approves the paused refund-1 here (stderr is no terminal: lines, no spinner)
    result = agentflow("resume", "refund-1", "--app", APP, "--approve", "--as", "ana")
    # Then stderr says which run the command waits for and for what, then the run's status as it changed
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == (
        "waiting for run refund-1: it runs in this process, its tools too, "
        "until it ends, pauses or waits for a decision"
    )
    assert lines[1].startswith("run refund-1: now running at step 2, after ")
    assert lines[2].startswith("run refund-1: now done at step 3, after ")
    assert len(lines) == 3 and "\r" not in result.stderr
    # And stdout is the command's result, as it was
    assert result.stdout == "run refund-1: approved; now done at step 3\n"


def test_a_command_refused_before_it_waits_says_nothing_of_waiting(agentflow, db):
    # Given refund-1, held by a live worker
    runs_kit.hold(db, "refund-1")
    # When the operator tries to approve it here, Then the refusal is the one line on stderr
    result = agentflow("resume", "refund-1", "--app", APP, "--approve")
    assert result.exit_code == 2
    assert "is held by" in one_line_error(result)


def test_recover_here_without_a_terminal_says_each_run_it_runs_and_how_it_ends(agentflow):
    # When the operator recovers ship-1 here, rerunning its call in doubt (no terminal: no bar is drawn)
    result = agentflow("recover", "ship-1", "--app", APP, "--rerun-in-doubt", "--as", "ops")
    # Then stderr has the bar's label, which run the command runs, and its status as it changed
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == "recovering 1 run(s)"
    assert lines[1].startswith("waiting for run ship-1: it runs in this process")
    assert lines[-1].startswith("run ship-1: now done at step ")
    assert "ship-1  done" in result.stdout


async def test_a_terminal_gets_a_spinner_that_each_line_erases_first(capsys):
    # Given a command's progress on a terminal, redrawn every 10 ms
    progress = Progress(terminal=True, tick_s=0.01)
    written: list[str] = []

    def stderr() -> str:
        written.append(capsys.readouterr().err)
        return "".join(written)

    # When it waits for a run that is calling a tool, then sees it done
    async with progress.spinning():
        progress.waiting("r-1", "a worker carries it on")
        progress.saw("r-1", "running", 2)
        progress.doing("r-1", "calling ship")
        await until(lambda: "run r-1: running at step 2, calling ship (" in stderr(), "the spinner drawn")
        progress.saw("r-1", "done", 3)
    err = stderr()
    # Then the spinner's line is redrawn in place (no line break of its own), each line first erases it,
    # and the spinner is erased when the wait ends
    assert f"{ERASE_LINE}| run r-1: running at step 2, calling ship (" in err
    assert f"{ERASE_LINE}run r-1: now done at step 3, after " in err
    assert err.endswith(ERASE_LINE)
    # (what a reader sees of each line: what follows the last erase before its line break)
    seen = [chunk.rpartition(ERASE_LINE)[2] for chunk in err.split("\n")]
    assert seen[0] == "waiting for run r-1: a worker carries it on"
    assert seen[1].startswith("run r-1: now running at step 2, after ")
    assert seen[2].startswith("run r-1: now done at step 3, after ")
    assert seen[3:] == [""]


async def test_without_a_terminal_there_are_lines_and_no_spinner(capsys):
    progress = Progress(terminal=False, tick_s=0.01)
    async with progress.spinning():
        progress.waiting("r-1", "a worker carries it on")
        progress.saw("r-1", "running", 2)
        progress.saw("r-1", "running", 3)  # the same status at a later step: no line
        progress.saw("r-1", "paused", 4)
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    assert [line.partition(", after")[0] for line in err.splitlines()] == [
        "waiting for run r-1: a worker carries it on",
        "run r-1: now running at step 2",
        "run r-1: now paused at step 4",
    ]
