"""``agentflow runs prune``: delete finished runs older than a duration, whole or all but their newest checkpoint.

``runs prune --older-than 30d`` lists the runs that ended (``done``, ``failed``,
``cancelled``; ``--status`` picks some) and were last saved longer ago than that, says how
many, asks (``--yes`` does not; with no terminal to ask on, it refuses), then prunes them
in batches (``--batch``) with a progress bar. ``--dry-run`` counts and deletes nothing.

``--trim`` keeps the runs and deletes only their older checkpoints: each keeps its newest
checkpoint, call records, lease and listing entries, so it still shows, lists and retries
(`retention` says what a trim keeps and why). Tool loops are never trimmed.

The store does the work (`agentflow.exec.checkpoints.retention`): each run is judged
again as it is deleted and goes whole, with its checkpoints, call records, lease and
listing entries; a run a live worker holds, or one retried or resumed since it was listed,
is left. A running or paused run is never pruned, however old. Before that, each listed
run is judged by its **signed** newest checkpoint (`retention.judged_rows`): the store lists by
fields it keeps in clear, which anyone with write access can set, so the command needs
the checkpoint key (``--key-env``) and prunes only runs whose newest checkpoint checks and
itself says it ended before the cut-off. A run whose newest row does not check is left,
and named. The store then deletes a run only if its newest row is still the one judged
(`retention.judged_rows`): a run retried while the person read the question is left.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from typing import Final

import click

from agentflow._display import when
from agentflow.cli import _errors
from agentflow.cli._target import open_target, store_options
from agentflow.cli._text import echo
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.records import ENDED, JudgedRows
from agentflow.exec.checkpoints.retention import DEFAULT_BATCH, judged_rows, prunable, prune, pruner, trimmable
from agentflow.exec.checkpoints.retention import trim as trim_runs
from agentflow.exec.checkpoints.rules import check_prune_statuses
from agentflow.exec.run.read import ALL_RUNS

#: Seconds per unit of a duration.
UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``30d``, ``12h``, ``90m``, ``45s`` or ``2w``.

    Raises:
        CliError: it is not a number followed by one of those units.
    """
    found = _DURATION.fullmatch(text.strip().lower())
    if found is None:
        raise _errors.CliError(
            f"--older-than {text!r} is not a duration: write a number and a unit, e.g. 30d, 12h, 90m, 45s or 2w"
        )
    return float(found[1]) * UNITS[found[2]]


def _duration(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    return parse_duration(value)


def _statuses(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    try:
        return check_prune_statuses([part.strip() for part in value.split(",") if part.strip()])
    except ValueError as exc:
        raise _errors.CliError(f"--status {value!r}: {exc}") from None


def _can_ask() -> bool:
    """Whether a person can answer the question (stdin is a terminal)."""
    return sys.stdin.isatty()


async def _go_ahead(deletes: str, yes: bool) -> bool:
    """Whether to delete `deletes` (``the 4 run(s) ...``): --yes, or the person at the terminal said so."""
    if yes:
        return True
    if not _can_ask():
        raise _errors.CliError(f"runs prune deletes {deletes}: say --yes to go ahead (no terminal to ask)")
    return await asyncio.to_thread(click.confirm, f"Delete {deletes} for good?", default=False, err=True)


async def _delete(
    store: CheckpointStore, rows_judged: JudgedRows, before: float, statuses: tuple[str, ...], *, trim: bool, batch: int
) -> tuple[int, int, list[tuple[str, str]]]:
    """Prune (or trim) the judged runs in batches behind a progress bar; how many runs went, their rows, and problems.

    The store deletes a run only if its newest row is still the one judged (`JudgedRows`): a
    run retried while the person read the question is left. So is a run whose call log goes
    on past that row (its later checkpoints moved aside): that one comes back with why.
    """
    run_ids = list(rows_judged)
    owner, done, rows = pruner("cli"), 0, 0
    problems: list[tuple[str, str]] = []
    with click.progressbar(length=len(run_ids), label="trimming" if trim else "pruning", file=sys.stderr) as bar:
        for start in range(0, len(run_ids), batch):
            chunk = run_ids[start : start + batch]
            if trim:
                trimmed = await trim_runs(store, chunk, before, statuses, rows_judged)
                done, rows = done + len(trimmed.run_ids), rows + trimmed.rows
                problems += trimmed.refused
            else:
                pruned = await prune(store, chunk, before, statuses, owner, rows_judged)
                done, rows = done + len(pruned.run_ids), rows + pruned.rows
                problems += pruned.refused
            bar.update(len(chunk))
    return done, rows, problems


@click.command("prune")
@store_options
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="DURATION",
    callback=_duration,
    help="Prune runs last saved longer ago than this: 30d, 12h, 90m, 45s, 2w.",
)
@click.option(
    "--status",
    "statuses",
    default=",".join(sorted(ENDED)),
    show_default=True,
    metavar="LIST",
    callback=_statuses,
    help="Which finished runs, comma-separated (never running or paused ones).",
)
@click.option(
    "--trim",
    is_flag=True,
    help="Keep the runs; delete only their older checkpoints (each keeps its newest, its call records and listing).",
)
@click.option("--dry-run", is_flag=True, help="Count the runs it would prune (or trim); delete nothing.")
@click.option("--yes", "-y", is_flag=True, help="Prune without asking.")
@click.option(
    "--batch", default=DEFAULT_BATCH, show_default=True, type=click.IntRange(1, 10_000), help="Runs per batch."
)
def prune_runs(
    store_url: str,
    key_env: str,
    older_than: float,
    statuses: tuple[str, ...],
    trim: bool,
    dry_run: bool,
    yes: bool,
    batch: int,
) -> None:
    """Delete the runs that ended (done, failed, cancelled) and were last saved longer ago than --older-than.

    Each run goes whole: its checkpoints, call records, lease and listing entries. With
    --trim each run stays and only its older checkpoints go: its newest checkpoint, call
    records and listing entries stay, so it still shows and can be retried (tool loops are
    never trimmed). Runs a worker holds, and runs retried or resumed meanwhile, are left.
    Asks first (--yes does not); --dry-run only counts. Each run is judged by its signed
    newest checkpoint, so the checkpoint key is needed (--key-env); a run whose newest
    checkpoint does not check is left, and named.
    """
    target = open_target(store_url, key_env)
    store = target.store
    before = time.time() - older_than
    verb = "trim" if trim else "prune"
    what = f"ended ({', '.join(statuses)}) and last saved before {when(before)}"
    what += ", with older checkpoints to trim" if trim else ""

    async def job() -> None:
        if trim:
            listed = [run_id for run_id, _ in await trimmable(store, before, statuses, ALL_RUNS)]
        else:
            listed = await prunable(store, before, statuses, ALL_RUNS)
        rows_judged, refused = await judged_rows(store, listed, before, statuses, target.sealer.checkpoint_problem)
        run_ids = list(rows_judged)
        for run_id, why in refused.items():
            echo(f"left run {run_id}: its newest checkpoint does not check ({why})")
        if not run_ids:
            echo(f"no runs to {verb}: none {what}")
            return
        count = f"{len(run_ids)} run(s) {what}"
        if len(listed) == ALL_RUNS:
            count += " (the first million: run it again for the rest)"
        if dry_run:
            echo(f"would {verb} {count} (--dry-run: nothing was deleted)")
            return
        echo(f"found {count}")
        if not await _go_ahead(f"the older checkpoints of the {count}" if trim else f"the {count}", yes):
            echo(f"nothing was {'trimmed' if trim else 'pruned'}")
            return
        done, rows, problems = await _delete(store, rows_judged, before, statuses, trim=trim, batch=batch)
        for run_id, why in problems:
            echo(f"left run {run_id}: {why}")
        if trim:
            echo(f"trimmed {done} run(s) ({rows} checkpoint rows; each kept its newest checkpoint and call records)")
        else:
            echo(f"pruned {done} run(s) ({rows} checkpoint and call rows)")
        if done + len(problems) < len(run_ids):
            left = len(run_ids) - done - len(problems)
            echo(f"{left} run(s) were left: held by a worker, or retried or resumed since listed")

    target.run(job)
