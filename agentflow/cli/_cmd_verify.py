"""``agentflow verify``: check every signature and every number of one run or of all of them."""

from __future__ import annotations

import click

from agentflow._display import printable
from agentflow.cli import _errors
from agentflow.cli._target import open_target, store_options
from agentflow.cli._text import echo, paint
from agentflow.exec._run_read import read_all, read_run
from agentflow.exec._run_view import RunReport


@click.command("verify")
@store_options
@click.argument("run_id", required=False)
@click.option(
    "--all", "every", is_flag=True, help="Check every run in the store, and the listing index against the stored rows."
)
def verify(store_url: str, key_env: str, run_id: str | None, every: bool) -> None:
    """Check each checkpoint and call record: signature, numbering, segments, record counts.

    Exits 1 naming every run and row that fails, 0 with a count when all check.
    """
    if (run_id is None) == (not every):
        raise click.UsageError("give a RUN_ID or --all (not both)")
    target = open_target(store_url, key_env)
    if run_id is not None:
        reports: list[RunReport] = [target.run(lambda: read_run(target.store, target.sealer, run_id))]
    else:
        reports = target.run(lambda: read_all(target.store, target.sealer))
    bad = [rep for rep in reports if rep.corrupt]
    for rep in bad:
        for problem in rep.problems:
            echo(f"{paint('CORRUPT')} {printable(rep.run_id)}: {printable(problem)}")
    if bad:
        hint = target.wrong_key(bad)
        raise _errors.ProblemsFound(hint or f"{len(bad)} of {len(reports)} run(s) have rows that fail their check")
    checkpoints = sum(len(rep.checkpoints) for rep in reports)
    records = sum(rep.records for rep in reports)
    echo(
        f"{paint('ok', 'done')}: {len(reports)} run(s), {checkpoints} checkpoints and {records} call records; "
        "every signature and number checks"
    )
