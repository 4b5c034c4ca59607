"""The ``agentflow`` command group: every subcommand, registered in one place."""

from __future__ import annotations

import click

from agentflow._display import printable
from agentflow.cli._cmd_act import resume
from agentflow.cli._cmd_events import events
from agentflow.cli._cmd_migrate import migrate
from agentflow.cli._cmd_operate import cancel, decide, fork, retry
from agentflow.cli._cmd_prune import prune_runs
from agentflow.cli._cmd_recover import recover
from agentflow.cli._cmd_runs import runs
from agentflow.cli._cmd_serve import demo, viewer
from agentflow.cli._cmd_verify import verify


class _Commands(click.Group):
    """The command group; it refuses, before any command reads them, arguments that are not text.

    An argument holding a byte that is not UTF-8 reaches Python as a lone surrogate
    (``surrogateescape``), which no store, signature or JSON takes: it is refused here, with
    the argument named, as a usage error (exit code 2).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Refuse an argument that is not text; then parse as a group does.

        Raises:
            click.UsageError: an argument holds a byte that is not UTF-8.
        """
        for index, arg in enumerate(args, start=1):
            try:
                arg.encode()
            except UnicodeEncodeError as exc:
                raise click.UsageError(
                    f"argument {index} ({printable(arg)}) holds a byte that is not UTF-8 text "
                    f"at character {exc.start}: pass valid UTF-8 text",
                    ctx,
                ) from None
        return super().parse_args(ctx, args)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="agentflow", prog_name="agentflow")
def cli() -> None:
    """Inspect, check, follow, recover, resume, decide, retry, cancel, fork, migrate and prune durable agentflow runs.

    Every command but demo takes --store URL (or $AGENTFLOW_STORE) and, but runs prune, reads
    the checkpoint key from $AGENTFLOW_CHECKPOINT_KEYS (or the variable --key-env names); the
    demo's public key only with --allow-demo-key. The acting commands, and runs list, runs
    show, verify and events, can use the deployment's Celery workers instead (--workers
    MODULE:ATTR, or $AGENTFLOW_WORKERS): its store and key, and the tools run on the workers.
    A command that waits for a run says on stderr what it waits for and how the run goes.
    What the store holds is shown with control characters escaped.
    """


runs.add_command(prune_runs)
for command in (runs, verify, events, recover, resume, decide, retry, cancel, fork, migrate, viewer, demo):
    cli.add_command(command)
