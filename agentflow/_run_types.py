"""What every run is, whatever drives it: its status, its kind, and a flow run's version.

Both are base types: the stores, the tool loop, flows, the workers and the surfaces read
them, so they live below all of those and import nothing of agentflow.

A run's kind is also written in the ``flow`` column every store keeps in clear: a flow run
stores its flow's name, a tool loop stores ``loop:<name>``. `RunKind.of` and
`RunKind.column` are the only places that spelling is known. What differs between the kinds
everywhere a run is read (whether it has a version, whether its log runs a model call ahead
of its checkpoint) is said once, here, as the kind's properties.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final

_LOOP_PREFIX: Final = "loop:"


class RunStatus(StrEnum):
    """Where a run stands (the values are also the checkpoint statuses)."""

    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    """Ended by an operator's signed request; never recovered."""


class RunKind(StrEnum):
    """What drives a run: a flow's supersteps or a tool loop's stages."""

    FLOW = "flow"
    LOOP = "loop"

    @classmethod
    def of(cls, column: str) -> RunKind:
        """The kind of a run from its stored ``flow`` column."""
        return cls.LOOP if column.startswith(_LOOP_PREFIX) else cls.FLOW

    def column(self, name: str) -> str:
        """The ``flow`` column a run of this kind called `name` is stored under."""
        return _LOOP_PREFIX + name if self is RunKind.LOOP else name

    @classmethod
    def of_body(cls, body: Mapping[str, Any]) -> RunKind:
        """The kind a checked checkpoint body says it is (a flow's unless it says ``loop``)."""
        return cls.LOOP if body.get("kind") == cls.LOOP else cls.FLOW

    @staticmethod
    def name_of(column: str) -> str:
        """The flow's or loop's own name from a stored ``flow`` column."""
        return column.removeprefix(_LOOP_PREFIX)

    @property
    def noun(self) -> str:
        """What a run of this kind is called in a message: ``flow`` or ``tool loop``."""
        return "tool loop" if self is RunKind.LOOP else "flow"

    @property
    def versioned(self) -> bool:
        """Whether a run of this kind is pinned to a version of what it runs.

        A flow run keeps the flow version it started on (its messages go to that version's
        queue); a tool loop runs on whatever the deployment's loop is.
        """
        return self is RunKind.FLOW

    @property
    def model_ahead(self) -> int:
        """How many supersteps past its checkpoint a run of this kind may log a model-call marker.

        A tool loop logs the marker of its next turn's model call before that turn's
        checkpoint (1); a flow logs no markers (0).
        """
        return 1 if self is RunKind.LOOP else 0


#: The version of a flow built without one, and of flow runs saved before versions existed.
DEFAULT_VERSION: Final = "1"


def version_of(body: Mapping[str, Any]) -> str:
    """The flow version a checked flow checkpoint body was saved on (`DEFAULT_VERSION` when it names none)."""
    version = body.get("version", DEFAULT_VERSION)
    return version if isinstance(version, str) else str(version)
