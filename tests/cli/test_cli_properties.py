"""Property: whatever strings a stored run holds, the CLI exits with a documented code and writes no raw control.

For any run id, state value, tool result, error and pending argument, ``runs list``,
``runs show`` and ``verify`` run to one of the documented exit codes (0, 1, 2; here 0 for
every stored run and 2 for one that is not there), raise nothing, and write no control
character but the line breaks between their own lines.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import click
import hostile_kit as hk
import pytest
from click.testing import Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: What a terminal acts on (controls, bidi and line separators, whole sequences), over-represented
#: so that most examples hold some; the rest is any text (but lone surrogates, which no store takes).
CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))] + ["\u202e", "\u2066", "\u2028", "\u2029"]
SEQUENCES = [hk.OSC_TITLE, hk.CLEAR, "\x1b[31m", "\x9b2J", "\x1bP+q\x1b\\"]
texts = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(CONTROLS + SEQUENCES)), max_size=8).map("".join)
#: The documented exit codes (agentflow/cli/_errors.py).
EXIT_CODES = (0, 1, 2)


def unstyled(text: str, **_: Any) -> str:
    return text


def check(result: Result, *, code: int) -> str:
    """The command ended with `code` (a documented one) and wrote no raw control character."""
    assert result.exit_code in EXIT_CODES and result.exit_code == code, result.output
    for stream in (result.stdout, result.stderr):
        assert hk.RAW_CONTROL.findall(stream) == [], repr(stream)
    return result.stdout


@pytest.mark.slow  # a property over many CLI runs
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run_id=texts.filter(bool), state=texts, result=texts, error=texts, args=texts)
def test_any_stored_string_is_shown_escaped_with_a_documented_exit_code(
    run_id: str, state: str, result: str, error: str, args: str
) -> None:
    runs = [
        (hk.FETCHING, run_id, state + result),  # the state holds the text; the tool returns it as its result
        (hk.FAILING, run_id + "/failed", error),  # the tool raises it: the call's and the run's error
        (hk.PAYING, run_id + "/paused", args),  # the pending call's arguments
    ]
    # colours off (each is a control sequence of the CLI's own), and nothing stripped by click
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(click, "style", unstyled):
        url = hk.write_runs(Path(tmp) / "runs.db", runs)
        listed = check(hk.invoke(url, "runs", "list"), code=0)
        assert len(listed.splitlines()) == 2 + len(runs)  # the header, a line per run, the count
        for _, rid, _ in runs:  # after "--": a run id may start with "-" (click would take it for an option)
            check(hk.invoke(url, "runs", "show", "--", rid), code=0)
            check(hk.invoke(url, "verify", "--", rid), code=0)
        check(hk.invoke(url, "verify", "--all"), code=0)
        missing = hk.invoke(url, "runs", "show", "--", run_id + "/missing")
        check(missing, code=2)
        assert len(missing.stderr.splitlines()) == 1
