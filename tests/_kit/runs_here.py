"""`runs_here`: an app's runs by id in this process, held as ``<name>@<host>:<pid>`` (as the CLI acts)."""

from __future__ import annotations

from collections.abc import Sequence

from agentflow import FlowApp
from agentflow._events import Events
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.lease import process_owner
from agentflow.runs import Runs


def runs_here(app: FlowApp, store: CheckpointStore, keys: Sequence[bytes] | bytes, *, name: str = "operator") -> Runs:
    """`app`'s runs in `store`, acted on here; what this process does to them goes into their event streams."""
    return Runs(app, app.runner(store, keys, owner=process_owner(name), events=Events(record=True)))
