"""``--workers module:attr``: find the deployment an operator's command acts through.

The CLI and the viewer act on a distributed deployment through the `AgentflowTasks` its
workers registered (``workers.celery_app:tasks`` in the runnable ``workers`` package). The
module builds them from the same settings the workers read, so the command sees the same
store, key ring, prefix and queue, and sends every action that runs a tool to the workers.
"""

from __future__ import annotations

from agentflow._app import import_attribute
from agentflow.celery._tasks import AgentflowTasks


def load_tasks(path: str) -> AgentflowTasks:
    """Import the `AgentflowTasks` at ``"package.module:attribute"``.

    Raises:
        ValueError: the path is malformed, does not import, or names something else.
    """
    try:
        tasks, module_name, attr = import_attribute(path, "--workers", "workers.celery_app:tasks")
    except ValueError:
        raise
    except Exception as exc:  # the module failed while building the deployment (bad settings, ...)
        raise ValueError(
            f"--workers {path!r}: importing {path.partition(':')[0]!r} failed ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(tasks, AgentflowTasks):
        found = "nothing" if tasks is None else type(tasks).__name__
        raise ValueError(
            f"--workers {path!r}: {attr!r} in {module_name!r} is {found}, not the AgentflowTasks "
            "register_tasks returned"
        )
    return tasks
