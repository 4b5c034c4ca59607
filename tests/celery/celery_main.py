"""``celery -A workers ...`` forked warm: the worker, beat and Flower processes of the Celery tests.

A fresh ``python -m celery -A workers worker`` spends about a second of CPU importing Celery,
kombu, billiard, Flower's command, pydantic-ai (the kit's app serves agents too) and agentflow
before it does anything, and the suite starts some ninety. A warm server of this script
(`_kit.forkserver`) imports them once per pytest process (``PRELOAD``), and each worker, beat
or Flower is a child forked from it (`_kit.forkpopen.spawn_logged`, from
`celery_kit.Deployment`).

The child is then what the command would have been: its own session (its process group is
the worker and its pool, which ``killpg`` ends at once), the deployment's environment (the
server has imported no module that reads ``AGENTFLOW_*``: the app ``workers`` builds from the
settings is imported in the child; prometheus-client, which reads its one variable when it is
imported, is told again), its own connections, and Celery's command line.
"""

from __future__ import annotations

import os
import sys

#: Imported once by the warm server: what every ``celery -A workers`` child would import first.
#: Nothing here reads the deployment's settings (``workers``, ``celery_flows`` and ``config``'s
#: `Settings` instance are the child's).
PRELOAD = (
    "celery.bin.celery",
    "celery.apps.worker",
    "celery.apps.beat",
    "celery.worker.consumer",
    "billiard.pool",
    "kombu.transport.redis",
    "kombu.transport.pyamqp",
    "flower.command",
    "pydantic_ai",
    "config.settings",
    "agentflow.celery",
    "agentflow.integrations.pydantic_ai",
    "agentflow.exec.checkpoints.redis",
    "agentflow.exec.checkpoints.sqlalchemy",
    "redis.asyncio",
)


def main(argv: list[str]) -> None:
    """Run ``celery -A workers <argv>`` in a session of its own, importing from the deployment's ``PYTHONPATH``."""
    os.setsid()
    for folder in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)  # a deployment's own flows (another test folder's app module)
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        # prometheus-client picks where its values live when it is imported (Celery's command
        # imports it, through Flower's): pick again, as a fresh interpreter with this
        # environment would have. No metric of the worker's exists yet.
        from prometheus_client import values

        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    from celery.bin.celery import main as celery

    sys.argv = ["celery", "-A", "workers", *argv]
    celery()


if __name__ == "__main__":
    main(sys.argv[1:])
