"""Terminal escapes: no string read from a store reaches the terminal as a control sequence.

Issue 16: ``agentflow runs show`` printed run ids and tool results raw, so an OSC title
sequence and ``ESC[2J`` in a tool result reached the operator's terminal. The commands run
here as on a terminal (colours kept, nothing stripped by click).
"""

from __future__ import annotations

import json
from pathlib import Path

import hostile_kit as hk
import pytest
import runs_kit
from hostile_kit import CLEAR, OSC_TITLE, invoke, raw_controls

from agentflow._display import printable, short
from agentflow.cli._text import echo, paint, table, terminal_safe

PAYLOAD = f"ok {OSC_TITLE} then {CLEAR} and \x1b[31mred\x07\x9b2J\x7f"
EVIL_ID = "evil\x1b[2J\x07-1"


@pytest.fixture
def hostile(tmp_path: Path) -> str:
    """A store whose run ids, names, states, results, errors and arguments carry escape sequences."""
    return hk.write_runs(
        tmp_path / "hostile.db",
        [
            (hk.FETCHING, EVIL_ID, PAYLOAD),
            (hk.FAILING, f"fails{OSC_TITLE}", PAYLOAD),
            (hk.PAYING, f"pays{CLEAR}", PAYLOAD),
        ],
    )


def assert_terminal_safe(output: str) -> None:
    assert raw_controls(output) == [], repr(output)
    assert "\x07" not in output and OSC_TITLE not in output and CLEAR not in output


def test_runs_show_escapes_a_tool_result_with_an_osc_title_and_a_clear_screen(hostile: str) -> None:
    # Given a run whose tool returned an OSC title sequence and ESC[2J, under a run id with controls
    # When it is shown on a terminal
    result = invoke(hostile, "runs", "show", EVIL_ID)
    # Then no raw ESC or BEL reaches stdout: each is written as an escape, and the rest is kept
    assert result.exit_code == 0, result.output
    assert_terminal_safe(result.output)
    assert "run evil\\x1b[2J\\x07-1   flow fetch\\x1b]0;flow\\x07ing" in result.stdout
    assert "ok \\x1b]0;pwned\\x07 then \\x1b[2J" in result.stdout  # the result, in the calls table
    assert "fe\\x1b[7mtch  no\\x07de" in result.stdout  # tool and node names
    # and the state is JSON, as before: its strings were always escaped
    assert json.dumps(PAYLOAD) in result.stdout


def test_runs_show_escapes_errors_and_pending_arguments(hostile: str) -> None:
    failed = invoke(hostile, "runs", "show", f"fails{OSC_TITLE}")
    assert failed.exit_code == 0, failed.output
    assert_terminal_safe(failed.output)
    assert "error: ValueError: ok \\x1b]0;pwned\\x07 then \\x1b[2J" in failed.stdout
    paused = invoke(hostile, "runs", "show", f"pays{CLEAR}")
    assert paused.exit_code == 0, paused.output
    assert_terminal_safe(paused.output)
    assert "agentflow resume pays\\x1b[2J --app" in paused.stdout
    assert 'pay {"text": "ok \\u001b]0;pwned\\u0007' in paused.stdout  # arguments, as JSON


def test_runs_list_escapes_run_ids_and_flow_names(hostile: str) -> None:
    result = invoke(hostile, "runs", "list")
    assert result.exit_code == 0, result.output
    assert_terminal_safe(result.output)
    assert "evil\\x1b[2J\\x07-1" in result.stdout and "fetch\\x1b]0;flow\\x07ing" in result.stdout
    assert len(result.stdout.splitlines()) == 5  # the header, three runs, the count: no line was faked


def test_verify_escapes_the_run_ids_and_problems_it_names(hostile: str, tmp_path: Path) -> None:
    # Given the hostile run's first checkpoint changed behind agentflow's back
    runs_kit.tamper(tmp_path / "hostile.db", EVIL_ID, 0, find=b"ok")
    # When every run is verified
    result = invoke(hostile, "verify", "--all")
    # Then the run is named, escaped, in the report and in the error line
    assert result.exit_code == 1
    assert_terminal_safe(result.output)
    assert "CORRUPT evil\\x1b[2J\\x07-1: checkpoint 0 of run 'evil\\x1b[2J\\x07-1'" in click_unstyled(result.stdout)
    assert result.stderr.startswith("agentflow: 1 of 3 run(s)")


def test_errors_escape_what_they_quote(hostile: str) -> None:
    # a run id given on the command line, quoted back in the error line
    result = invoke(hostile, "runs", "show", f"nope{OSC_TITLE}\nagentflow: ok")
    assert result.exit_code == 2
    assert_terminal_safe(result.output)
    assert len(result.stderr.splitlines()) == 1


def test_resume_and_recover_escape_what_the_store_and_the_app_say(hostile: str) -> None:
    # Given the paused run, denied with a note that carries escape sequences
    denied = invoke(hostile, "resume", f"pays{CLEAR}", "--app", "hostile_kit:app", "--deny", "--note", PAYLOAD)
    # Then the command's own lines are escaped, and so is the note, shown as the call's error
    assert_terminal_safe(denied.output)
    assert "run pays\\x1b[2J: denied" in denied.stdout
    shown = invoke(hostile, "runs", "show", f"pays{CLEAR}")
    assert_terminal_safe(shown.output)
    assert "ok \\x1b]0;pwned\\x07" in shown.stdout
    # and recover's listing, summary and progress label are escaped too
    recovered = invoke(hostile, "recover", "--flow", "fetch\x1b]0;flow\x07ing", "--yes", "--app", "hostile_kit:app")
    assert recovered.exit_code == 0
    assert_terminal_safe(recovered.output)


def test_a_value_cannot_fake_a_line_of_output(tmp_path: Path) -> None:
    # Given a failed run whose error holds a line break and a line of its own
    url = hk.write_runs(tmp_path / "lines.db", [(hk.FAILING, "f-1", "x\nok: 9 run(s); every signature checks")])
    result = invoke(url, "runs", "show", "f-1")
    # Then the break is written as \n: the error stays on its line
    assert "error: ValueError: x\\nok: 9 run(s)" in result.stdout
    assert not any(line.startswith("ok:") for line in result.stdout.splitlines())


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b]0;t\x07", "\\x1b]0;t\\x07"),
        ("a\nb\tc\rd", "a\\nb\\tc\\rd"),
        ("\x00\x7f\x85\x9b", "\\x00\\x7f\\x85\\x9b"),
        ("\u202eevil\u2066\u2028", "\\u202eevil\\u2066\\u2028"),
        ("\ud800", "\\ud800"),
        ("é 日本 ✓ \\x1b", "é 日本 ✓ \\x1b"),  # printable text, backslashes included, is kept
    ],
)
def test_printable_escapes_controls_and_keeps_printable_unicode(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_printable_keeps_what_it_is_told_to() -> None:
    assert printable("a\nb\x1b", keep="\n") == "a\nb\\x1b"


def test_short_escapes_after_joining_whitespace() -> None:
    assert short("a\n\tb\x1b[2J", 60) == "a b\\x1b[2J"
    assert short({"k": "\x07"}) == '{"k": "\\u0007"}'


def test_table_and_paint_escape_their_cells() -> None:
    text = table(["run", "status"], [["r\x1b[2J", "done\x07"]], colour=1)
    assert raw_controls(text) == []
    assert "r\\x1b[2J" in text and "done\\x07" in text
    assert raw_controls(paint("\x1b]0;t\x07")) == []


def test_echo_lets_only_line_breaks_and_its_own_colours_through(capsys: pytest.CaptureFixture[str]) -> None:
    # Even a string a command forgot to escape cannot carry a control sequence out
    text = f"{paint('done')} {OSC_TITLE}{CLEAR}\nnext\x9b2J"
    safe = terminal_safe(text)
    assert raw_controls(safe) == [] and safe.startswith(paint("done"))
    assert safe.endswith("\\x1b]0;pwned\\x07\\x1b[2J\nnext\\x9b2J")
    echo(text)
    assert capsys.readouterr().out == click_unstyled(safe) + "\n"


def click_unstyled(text: str) -> str:
    return hk.OWN_STYLES.sub("", text)
