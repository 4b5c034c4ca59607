"""``agentflow verify``: check every signature and every number of one run or of all of them.

Each run's event stream is checked too, read whole (`agentflow.exec.run.events.stream_problems`:
signatures, the chain, and its end against the newest checkpoint); what does not check is an
``EVENTS`` line. A run whose event stream does not check is not corrupt (its rows check, and
nothing of the run's progress comes from its events), so it is never quarantined for it.
"""

from __future__ import annotations

import click

from agentflow._display import printable
from agentflow.cli import _errors
from agentflow.cli._keys import key_ids
from agentflow.cli._reading import open_reading, reading_options
from agentflow.cli._show import check_summary, quarantine_text
from agentflow.cli._text import echo, paint
from agentflow.exec.run.erasure import report_erasures
from agentflow.exec.run.events import stream_problems
from agentflow.exec.run.markers import Markers
from agentflow.exec.run.quarantine import QUARANTINED, marks
from agentflow.exec.run.read import read_all, read_run
from agentflow.exec.run.trim import trimmed_text
from agentflow.exec.run.view import RunReport


def _echo_streams(streams: dict[str, list[str]]) -> None:
    for rid, problems in streams.items():
        for problem in problems:
            echo(f"{paint('EVENTS', 'PROBLEM')} {printable(rid)}: {printable(problem)}")


def _refuse_streams(streams: dict[str, list[str]]) -> None:
    """Exit 1 when an event stream does not check (after the rows' own summary, which says more)."""
    broken = sorted(rid for rid, problems in streams.items() if problems)
    if broken:
        raise _errors.ProblemsFound(
            f"the event stream of {len(broken)} run(s) does not check (EVENTS above): "
            f"{', '.join(printable(rid) for rid in broken[:5])}{' ...' if len(broken) > 5 else ''}"
        )


@click.command("verify")
@reading_options
@click.argument("run_id", required=False)
@click.option(
    "--all", "every", is_flag=True, help="Check every run in the store, and the listing index against the stored rows."
)
def verify(store_url: str | None, key_env: str, workers_path: str | None, run_id: str | None, every: bool) -> None:
    """Check each checkpoint and call record: signature, numbering, segments, record counts, what was erased.

    Exits 1 naming every run and row that fails (and whether recover_all quarantined the
    run), 0 with a count when all check.
    """
    if (run_id is None) == (not every):
        raise click.UsageError("give a RUN_ID or --all (not both)")
    target = open_reading(store_url, key_env, workers_path).target

    async def read() -> tuple[list[RunReport], list[str], dict[str, list[str]]]:
        if run_id is not None:
            reports = [await read_run(target.store, target.sealer, run_id)]
        else:
            reports = await read_all(target.store, target.sealer)
        await report_erasures(target.store, target.sealer, reports)
        held = await marks(
            Markers(target.store, target.sealer), [rep.run_id for rep in reports if rep.corrupt], QUARANTINED
        )
        streams = {  # a run whose rows fail is reported for them (its stream is read once they check)
            rep.run_id: await stream_problems(target.store, target.sealer, rep.run_id)
            for rep in reports
            if not rep.corrupt
        }
        return reports, [quarantine_text(rid, mark) for rid, mark in held.items()], streams

    reports, quarantined, streams = target.run(read)
    bad = [rep for rep in reports if rep.corrupt]
    for rep in bad:
        for problem in rep.problems:
            echo(f"{paint('CORRUPT')} {printable(rep.run_id)}: {printable(problem)}")
    _echo_streams(streams)
    for line in quarantined:
        echo(line)
    summary = check_summary(reports, target.key_env, key_ids(target.keys))
    if summary is not None:
        raise _errors.ProblemsFound(summary)
    _refuse_streams(streams)
    for rep in reports:
        if rep.kept_from:  # a history that starts where retention trimmed it: said, not reported missing
            echo(f"{paint('trimmed', 'paused')} {printable(rep.run_id)}: {trimmed_text(rep.kept_from)}")
    checkpoints = sum(len(rep.checkpoints) for rep in reports)
    records = sum(rep.records for rep in reports)
    trimmed = sum(1 for rep in reports if rep.kept_from)
    echo(
        f"{paint('ok', 'done')}: {len(reports)} run(s), {checkpoints} checkpoints and {records} call records; "
        "every signature and number checks, and every event stream's chain"
        + (f" ({trimmed} run(s) trimmed by retention: their older checkpoints are not stored)" if trimmed else "")
    )
