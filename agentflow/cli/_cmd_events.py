"""``agentflow events RUN_ID``: a run's stored events, one line each; ``--follow`` prints the new ones as they come.

The events are read with agentflow's own reader (`agentflow.exec.run.events`: `read_events`,
page by page, or `follow_events` with ``--follow``), which checks each one under the key
ring as it reads it; this module only writes the lines. A line is the event's cursor
(``--after`` takes it, to read on from the next event), its local time to the millisecond,
its name and its fields as ``name=value`` (those that say what happened: not how it was
stored, not the empty ones). What the reader did not take as an event is written as such:

- ``PROBLEM``: a stored event that does not check (forged, signed with another key, moved
  from another run, a copy of one read before, out of order, unreadable), with the reason
  and nothing of its data;
- ``GAP``: events missing before the one that follows (which checks, and is printed after it).

The reader checks the run's event chain (`agentflow.exec.event_chain`): with ``--after`` it
first reads the stream up to the cursor, so a copy of an earlier entry appended later is a
``PROBLEM``; what only the stream's end tells (entries cut after the head the newest
checkpoint names, an ended run without its last events) comes last, as ``PROBLEM`` lines.

Either makes the exit code 1, once every event was printed. The run itself must be stored
and check, as for ``runs show`` (the read model): nothing of a run with a failing row is
shown. ``--follow`` ends when the run has ended and its last events are printed (exit 0),
or on Ctrl-C (exit 130, naming the last cursor printed). stdout holds the event lines only.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Final

import click

from agentflow._display import printable, short, when
from agentflow.cli import _errors
from agentflow.cli._keys import key_ids
from agentflow.cli._reading import open_reading, reading_options
from agentflow.cli._show import other_keys_text
from agentflow.cli._target import Target
from agentflow.cli._text import echo, paint
from agentflow.exec.run.events import Positions, RunEvent, follow_events, prime, read_events, stream_end
from agentflow.exec.run.read import read_run, signed_with_other_keys

#: Fields that say how an event was stored or timed, not what happened: not printed.
QUIET: Final = frozenset({"kind", "seconds"})
#: Fields printed first, in this order, when an event has them (the rest follow by name).
FIRST: Final = ("tool", "model", "node", "step", "status", "claim", "call_id")
#: The exit code after Ctrl-C, as a shell reports a command stopped by it.
INTERRUPTED: Final = 130
#: How many events one read asks for (without --follow).
PAGE: Final = 1000
#: The width of a value in a line (longer ones are cut).
VALUE_WIDTH: Final = 80


def _stamp(at: float) -> str:
    return f"{when(at)}.{int(at * 1000) % 1000:03d}"


def _value(value: Any) -> str:
    """A field's value on one line: a plain word as it is, anything else as JSON (so a space cannot split it)."""
    if isinstance(value, str) and value and not any(c.isspace() or c in "\"'=" for c in value):
        return short(value, VALUE_WIDTH)
    return short(json.dumps(value, default=str, ensure_ascii=False), VALUE_WIDTH)


def event_lines(event: RunEvent) -> list[str]:
    """The lines of one event as read: the event, after a ``GAP`` line when events are missing before it.

    A stored event that does not check is one ``PROBLEM`` line with the reason, and nothing of its data.
    """
    cursor = printable(event.cursor).ljust(6)
    if not event.name:
        return [f"{cursor}  {'-':<23}  {paint('PROBLEM'.ljust(16), 'PROBLEM')}  {printable(event.problem or '')}"]
    stamp = _stamp(event.at)
    lines = []
    if event.problem is not None:
        lines.append(f"{cursor}  {stamp}  {paint('GAP'.ljust(16), 'GAP')}  {printable(event.problem)}")
    names = [name for name in FIRST if name in event.data] + sorted(set(event.data) - set(FIRST))
    fields = " ".join(
        f"{printable(name)}={_value(event.data[name])}"
        for name in names
        if name not in QUIET and event.data[name] not in (None, "", [], {})
    )
    lines.append(f"{cursor}  {stamp}  {printable(event.name).ljust(16)}  {fields}".rstrip())
    return lines


class StdoutClosed(Exception):
    """Raised when whatever read the lines went away (``agentflow events RUN_ID | head``): nothing more to print."""


@dataclass
class _Printed:
    """What the command printed so far: the last cursor (for Ctrl-C's line), how many problems and gaps."""

    last: str | None = None
    problems: int = 0
    gaps: int = 0

    def show(self, event: RunEvent) -> None:
        try:
            for line in event_lines(event):
                echo(line)
        except BrokenPipeError:
            raise StdoutClosed() from None
        self.last = event.cursor
        if event.problem is not None and not event.name:
            self.problems += 1
        elif event.problem is not None:
            self.gaps += 1


async def _check_run(target: Target, run_id: str) -> None:
    """Go on only with a stored run whose rows check, as ``runs show`` does.

    Raises:
        CliError: no such run, or it is signed with a key the ring does not hold.
        ProblemsFound: a row of it fails its check.
    """
    report = await read_run(target.store, target.sealer, run_id)
    if not report.corrupt:
        return
    wrong = other_keys_text([report], target.key_env, key_ids(target.keys))
    if wrong is not None and signed_with_other_keys([report]):
        raise _errors.CliError(f"{wrong}: give the key the workers sign with")
    raise _errors.ProblemsFound(
        f"run {run_id!r} has rows that fail their check, so none of it is shown "
        f"(agentflow verify {printable(run_id)} names them)"
    )


async def _print_events(target: Target, run_id: str, after: str | None, follow: bool, printed: _Printed) -> None:
    await _check_run(target, run_id)
    try:
        if follow:
            async for event in follow_events(target.store, target.sealer, run_id, after):
                printed.show(event)
            return
        # Across pages, and from the stream's start up to --after: a copy of an earlier event is seen as one
        positions = await prime(target.store, target.sealer, run_id, after, Positions())
        while True:
            batch = await read_events(target.store, target.sealer, run_id, after, PAGE, positions)
            for event in batch:
                printed.show(event)
            if len(batch) < PAGE:
                break
            after = batch[-1].cursor
        for event in await stream_end(target.store, target.sealer, run_id, positions):
            printed.show(event)
    except ValueError as exc:  # the store never gave that cursor
        raise _errors.CliError(
            f"--after {after!r}: {exc}; give a cursor from the first column of agentflow events"
        ) from None


@click.command("events")
@reading_options
@click.argument("run_id")
@click.option("--after", metavar="CURSOR", help="Only the events after this cursor (the first column of a line).")
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing new events as they are stored, until the run ends (or Ctrl-C)."
)
def events(
    store_url: str | None, key_env: str, workers_path: str | None, run_id: str, after: str | None, follow: bool
) -> None:
    """Print the events stored for a run, one line each: cursor, time, name, fields.

    Each event is checked as it is read; one that does not check is printed as PROBLEM,
    events missing before another as GAP, and the exit code is then 1. With --follow, new
    events are printed as the run makes them, until it ends (exit 0) or Ctrl-C (exit 130).
    """
    target = open_reading(store_url, key_env, workers_path).target
    printed = _Printed()
    try:
        target.run(lambda: _print_events(target, run_id, after, follow, printed))
    except StdoutClosed:
        # Nobody reads on: stop quietly, and let the interpreter's last flush go nowhere rather than fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    except KeyboardInterrupt:
        if not follow:
            raise
        last = printed.last or after
        on = f" --after {printable(last)}" if last else ""
        again = f"agentflow events {printable(run_id)}{on} --follow"
        echo(f"stopped following run {printable(run_id)}; go on with: {again}", err=True)
        raise click.exceptions.Exit(INTERRUPTED) from None
    if printed.last is None:
        echo(f"no events of run {printable(run_id)} stored" + (f" after {printable(after)}" if after else ""), err=True)
    if printed.problems or printed.gaps:
        raise _errors.ProblemsFound(
            f"run {run_id!r}: {printed.problems} stored event(s) did not check (PROBLEM above) and events are "
            f"missing in {printed.gaps} place(s) (GAP above)"
        )
