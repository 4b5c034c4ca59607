"""The errors agentflow raises, under one root.

```
AgentflowError
├── CheckpointError
│   ├── CheckpointNotFound
│   ├── CheckpointConflict
│   │   ├── Stale
│   │   ├── RunHeld                (.owner, .expires_at: a live worker holds the run)
│   │   ├── LeaseLost              (a worker's lease lapsed before a tool of it ran: the tool did not run)
│   │   └── ControlRefused         (a message no signed decision backs)
│   ├── CheckpointStoreCorrupt
│   ├── CheckpointTooLarge         (also a ValueError)
│   ├── StoreNotDurable            (a write was not acknowledged as durable in time; what needed it did not happen)
│   └── StoreRefused               (the store's server keeps less than the store was told to require)
├── UnstorableValue                (also a ValueError: text that is not Unicode, NaN, a huge integer, deep nesting)
├── RecoveryNeedsDecision          (.calls: list[tuple[str, str]])
├── RunFailed                      (.run_id, .error: a run ended failed; a worker's task raises it)
├── RunNotDone                     (.run_id, .status, .why: a run's result asked for before it is done)
├── IdentityMismatch               (also a PermissionError)
├── FlowError
│   └── VersionNotDeployed         (.run_id, .flow, .version, .deployed: the run's flow version is not here)
├── ModelError
├── LimitsUnavailable              (the shared limits' backend cannot be reached)
└── ToolError
    ├── UnknownTool
    ├── ToolArgumentsInvalid
    ├── ToolTimeout
    ├── ApprovalDenied
    └── RateLimited                (a provider's 429: .retry_after_s, .limit)
```

Users import them from `agentflow.errors`, their one public home.

Every error keeps all of its state in ``args`` and that state is JSON-able, so a Celery
result backend can carry it and ``type(e)(*e.args)`` rebuilds it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence


class AgentflowError(Exception):
    """Raised for every failure agentflow itself detects."""


class CheckpointError(AgentflowError):
    """Raised when the checkpoint store cannot do what was asked."""


class CheckpointNotFound(CheckpointError):
    """Raised when nothing is stored for a run id."""


class CheckpointConflict(CheckpointError):
    """Raised when another worker holds the run, the run ended, or it is another flow's."""


class Stale(CheckpointConflict):
    """Raised when a worker is asked to advance a run from a step it has already left."""


class RunHeld(CheckpointConflict):
    """Raised when a live worker holds the run's lease: nobody else may act on it until the lease ends.

    ``owner`` names the holder (``<name>@<host>:<pid>``) and ``expires_at`` when its lease
    lapses unless renewed (seconds since the epoch).
    """

    def __init__(self, run_id: str, owner: str, expires_at: float) -> None:
        super().__init__(run_id, owner, expires_at)
        self.run_id, self.owner, self.expires_at = run_id, owner, expires_at

    def __str__(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.expires_at))
        left = max(0.0, self.expires_at - time.time())
        return (
            f"run {self.run_id!r} is held by {self.owner} until {when} ({left:.0f} s from now): it is live, "
            "so nothing may act on it; if that worker died, try again once its lease has lapsed"
        )


class LeaseLost(CheckpointConflict):
    """Raised when a worker's lease on its run lapsed before a tool it logged ``started`` could run.

    The worker was stalled (frozen, paused, starved) past its lease between the ``started``
    record and the tool, and could not renew the lease (it lapsed, or another worker took the
    run over). The tool did not run, and this worker writes nothing more: its call stays in
    doubt for whoever holds the run now, who may safely decide that it did not happen.
    """


class ControlRefused(CheckpointConflict):
    """Raised when a message claims to carry a decision that no signed record of the run backs.

    A message grants nothing: a resume or a rerun is a signed claim checkpoint, and a
    message may only point at one. Nothing of the run is changed.
    """


class CheckpointStoreCorrupt(CheckpointError):
    """Raised when a stored row is unreadable, out of place, or its signature does not match."""


class CheckpointTooLarge(CheckpointError, ValueError):
    """Raised when a checkpoint would be larger than the run's limit; nothing is stored."""


class UnstorableValue(AgentflowError, ValueError):
    """Raised when a value holds what JSON-only storage cannot keep; the message says where and what to change.

    Text that is not Unicode (a lone surrogate, as a byte that is not UTF-8 becomes in a
    command's arguments), NaN or an infinity, an integer longer than Python writes as text
    (`sys.get_int_max_str_digits`, 4,300 digits), or nesting deeper than JSON is read or written.
    """


class StoreNotDurable(CheckpointError):
    """Raised when the store could not confirm in time that a write would survive the loss of its server.

    A store configured to wait (`RedisCheckpointStore`'s ``wait_replicas`` and ``wait_fsync``)
    raises it after the write itself took effect on the server: the write may be there, and may
    be lost in a failover. What needed the write did not happen yet: a tool whose ``started`` was
    not acknowledged did not run (should the record survive, its call is in doubt until someone
    says what happened). A run's step 0 or claim that was not acknowledged may survive: the run
    then exists and goes on (a worker's ``recover_all``, or `FlowRunner.recover`, carries it on
    once the store answers), so a start is retried with the same run id, which attaches to the
    run if it is there rather than starting a second one. The message names the setting and what
    was missing.
    """


class StoreRefused(CheckpointError):
    """Raised when the store's server keeps less than the store was told to require.

    A server that keeps nothing on disk while the store was made with ``allow_volatile=False``
    (what the workers ask for unless ``AGENTFLOW_STORE_ALLOW_VOLATILE`` is set), or one that
    cannot keep the waits the store was given (``wait_fsync`` without ``WAITAOF``, an append-only
    file or ``appendfsync always``). Nothing was written. A worker refuses to start on it; the
    message says what to set on the server, or in the settings.
    """


class RecoveryNeedsDecision(AgentflowError):
    """Raised when a call is in doubt and its tool is not idempotent.

    ``calls`` lists ``(tool, why)`` pairs and ``call_ids`` their call ids: check each at its
    system, then say what happened with ``decide_in_doubt``. The message names nothing that
    runs a tool where it is read: a worker's result and a client's error are read by people
    who must not rerun a payment from their own shell.
    """

    def __init__(self, run_id: str, calls: Sequence[Sequence[str]], call_ids: Sequence[str] = ()) -> None:
        pairs = [(str(tool), str(why)) for tool, why in calls]
        super().__init__(run_id, [list(p) for p in pairs], [str(c) for c in call_ids])
        self.run_id = run_id
        self.calls: list[tuple[str, str]] = pairs
        #: The ids of the calls in doubt, in the order of `calls` (what `decide_in_doubt` takes).
        self.call_ids: list[str] = [str(c) for c in call_ids]

    def __str__(self) -> str:
        listed = "; ".join(f"{tool}: {why}" for tool, why in self.calls)
        return (
            f"run {self.run_id!r} has calls in doubt ({listed}); check them at their system, "
            "then say what happened to each with decide_in_doubt (Rerun, Happened(result) or DidNotHappen(reason); "
            "agentflow decide RUN_ID --call CALL_ID=...)"
        )


class RunFailed(AgentflowError):
    """Raised by a worker's superstep task when the run it advanced ended failed.

    Everything the task had to do is done when it is raised (the run's failure is saved,
    nothing more is enqueued): it is there so Celery records the task as ``FAILURE`` with
    the run's error, and Flower shows it. ``error`` is the error the run ended with.
    """

    def __init__(self, run_id: str, error: str) -> None:
        super().__init__(run_id, error)
        self.run_id, self.error = run_id, error

    def __str__(self) -> str:
        return f"run {self.run_id!r} failed: {self.error}"


class RunNotDone(AgentflowError):
    """Raised when a run's result is asked for before the run is done.

    ``status`` is where the run stands (``running``, ``paused`` or ``cancelled``) and ``why``
    says what it waits for (a decision on calls in doubt, an approval, a timer, ...) or how
    it ended.
    """

    def __init__(self, run_id: str, status: str, why: str) -> None:
        super().__init__(run_id, status, why)
        self.run_id, self.status, self.why = run_id, status, why

    def __str__(self) -> str:
        return f"run {self.run_id!r} has no result yet: it is {self.status}, {self.why}"


class IdentityMismatch(AgentflowError, PermissionError):
    """Raised when a run is continued for another user or thread, or without its principal."""


class FlowError(AgentflowError):
    """Raised when a flow is built wrongly, its graph changed since a checkpoint, or it cannot go on."""


class VersionNotDeployed(FlowError):
    """Raised when a run's flow version is not among the versions at hand: it needs that version, or a migration.

    Nothing of the run is touched: it waits, unchanged, for a worker that has its version
    or for an operator's `migrate` to a version that is deployed.
    """

    def __init__(self, run_id: str, flow: str, version: str, deployed: Sequence[str]) -> None:
        super().__init__(run_id, flow, version, list(deployed))
        self.run_id, self.flow, self.version, self.deployed = run_id, flow, version, list(deployed)

    def __str__(self) -> str:
        here = ", ".join(self.deployed) or "none"
        return (
            f"run {self.run_id!r} is on version {self.version!r} of flow {self.flow!r}, which is not deployed here "
            f"(versions here: {here}); it needs migration (agentflow migrate {self.run_id} --to VERSION) "
            f"or a worker that has version {self.version!r}"
        )


class ModelError(AgentflowError):
    """Raised when a model's reply cannot be used, or the model cannot be reached."""


class ToolError(AgentflowError):
    """Raised when a tool call cannot be made."""


class UnknownTool(ToolError, LookupError):
    """Raised when a call names a tool the registry does not have."""


class ToolArgumentsInvalid(ToolError, ValueError):
    """Raised when a call's arguments do not match the tool's signature."""


class ToolTimeout(ToolError, TimeoutError):
    """Raised when a tool did not finish within its timeout on its last attempt."""


class ApprovalDenied(ToolError):
    """Raised inside a node when a call that needed approval was denied."""


class RateLimited(ToolError):
    """Raised by a tool (or a model) when its provider refused the call for now (an HTTP 429).

    ``RateLimited(message, retry_after_s=1.0, limit=None)``, all in ``args``: how long the
    provider asked to wait (its ``Retry-After``), and the limit it concerns (None: every
    limit of the call). Every worker sharing that limit waits it out, each with its own
    jitter; the call is then tried again.
    """

    @property
    def retry_after_s(self) -> float:
        """How long the provider asked to wait, in seconds (1 when it did not say)."""
        return float(self.args[1]) if len(self.args) > 1 else 1.0

    @property
    def limit(self) -> str | None:
        """The limit it concerns (None: every limit of the call)."""
        return str(self.args[2]) if len(self.args) > 2 and self.args[2] is not None else None

    def __str__(self) -> str:
        said = str(self.args[0]) if self.args else "rate limited"
        return f"{said} (retry after {self.retry_after_s} s)"


class LimitsUnavailable(AgentflowError):
    """Raised when the backend of the limits cannot be reached or did not answer in time."""
