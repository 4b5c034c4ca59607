"""What a reading command reads: the store ``--store`` names, or a deployment's (``--workers MODULE:ATTR``).

``runs list``, ``runs show``, ``verify`` and ``events`` take their source through
`reading_options` and `open_reading`: ``--store URL`` with the key in ``--key-env`` (as
before), or ``--workers MODULE:ATTR`` (or ``$AGENTFLOW_WORKERS``), the deployment the
acting commands act through, whose settings give the store, the key ring and the flows.
With ``--workers``, ``$AGENTFLOW_STORE`` is not read, and ``--store``, ``--key-env`` or
``--app`` on the command line is refused (the acting commands' rule, `refuse_beside_workers`):
the deployment's own key and flows are the ones that fit its runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import click

from agentflow._app import FlowApp
from agentflow.cli._apps import import_app
from agentflow.cli._target import Target, open_target, refuse_beside_workers, store_options, workers_option

F = TypeVar("F", bound=Callable[..., object])


@dataclass(repr=False)
class Reading:
    """The opened store and key ring a reading command reads, and the flows it knows (to mark migrations)."""

    target: Target
    app: FlowApp | None
    """``--app``, or the deployment's flows with ``--workers``; None: no flows given."""
    workers: str | None = None
    """The ``--workers`` read through (None: ``--store``): hints then name commands through the workers."""


def reading_options(fn: F) -> F:
    """Add ``--store``, ``--key-env``, ``--allow-demo-key`` and ``--workers`` to a reading command.

    It is called with the parameters ``store_url``, ``key_env`` and ``workers_path`` (for `open_reading`).
    """
    fn = workers_option(fn, what="Read the deployment's store with its key ring (and its flows)")
    return store_options(fn, required=False)


def open_reading(store_url: str | None, key_env: str, workers_path: str | None, app_path: str | None = None) -> Reading:
    """Open what the command reads, from its options (``app_path``: its ``--app``, if it has one).

    Raises:
        click.UsageError: neither ``--store`` nor ``--workers``, or an option of one beside the other.
        CliError: the app, the URL, the key or the deployment is not usable.
    """
    if workers_path:
        refuse_beside_workers(
            click.get_current_context(),
            {
                "store_url": "--store names a store to read",
                "key_env": "--key-env names a key to read with",
                "app_path": "--app names the flows to read with",
            },
            "reads the deployment's store with its key ring and flows",
        )
        from agentflow.cli._workers import read_through  # imports agentflow.celery: only with --workers

        target, flows = read_through(workers_path)
        return Reading(target, flows, workers_path)
    if not store_url:
        raise click.UsageError(
            "give --store URL (or $AGENTFLOW_STORE), or --workers MODULE:ATTR to read the deployment's store"
        )
    app = import_app(app_path) if app_path else None  # first: its errors say more than a store's
    return Reading(open_target(store_url, key_env), app)
