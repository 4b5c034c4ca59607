"""The ``agentflow`` command group: every subcommand, registered in one place."""

from __future__ import annotations

import click

from agentflow.cli._cmd_act import resume
from agentflow.cli._cmd_events import events
from agentflow.cli._cmd_migrate import migrate
from agentflow.cli._cmd_operate import cancel, decide, fork, retry
from agentflow.cli._cmd_prune import prune_runs
from agentflow.cli._cmd_recover import recover
from agentflow.cli._cmd_runs import runs
from agentflow.cli._cmd_serve import demo, viewer
from agentflow.cli._cmd_verify import verify


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
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
