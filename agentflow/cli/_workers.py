"""``--workers MODULE:ATTR``: act on runs, or read them, through a deployment; no tool runs here.

The `AgentflowTasks` the workers registered (``workers.celery_app:tasks`` in the runnable
deployment) carries the deployment's store, key ring, flows and queue. Every action goes
through `agentflow.celery.FlowClient`: what it decides is a signed claim saved here (this
process holds the key), and the message that follows carries ids only; a worker spends it
and runs the tools. The command then waits for each run it moved to settle (ended, paused,
or waiting for a decision), up to ``--timeout``, saying on stderr what it waits for and
each change of the run's status (`Progress`, from the run's newest checkpoint), and reads
it through the read model to report it; with ``--no-wait`` it reports what it enqueued.
The reading commands (``runs list``, ``runs show``, ``verify``, ``events``) take the
deployment's store, key ring and flows from here (`read_through`) and read as with ``--store``.

Only `_acting` and `_reading` import this module, and only when ``--workers`` is given:
`agentflow.celery` (the ``celery`` extra) is imported here, never by the rest of the CLI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from agentflow._app import FlowApp
from agentflow._display import printable
from agentflow._keys import is_public
from agentflow.cli import _errors
from agentflow.cli._apps import search_cwd
from agentflow.cli._keys import ALLOW_DEMO_KEY_ENV, DEFAULT_KEY_ENV
from agentflow.cli._progress import WAITING_FOR_DECISION, Progress
from agentflow.cli._target import Target, demo_key_allowed
from agentflow.cli._watch import polling_rows
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.checks import checked_latest
from agentflow.exec.run.read import read_run
from agentflow.exec.run.view import RunReport
from agentflow.exec.seal import Sealer

try:
    from agentflow.celery import AgentflowTasks, FlowClient, load_tasks
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise _errors.CliError(f"--workers needs the celery extra: pip install 'agentflow[celery]' ({exc})") from None

T = TypeVar("T")


@dataclass(frozen=True)
class Settled:
    """A run the command waited for, as the read model shows it afterwards."""

    report: RunReport
    """The run, every row checked."""
    timed_out: bool
    """It had not settled when ``--timeout`` ran out (the workers carry it on)."""

    @property
    def saved_by(self) -> str:
        """Who saved the run's latest checkpoint: the worker that moved it last (``<node>:<pid>``)."""
        checkpoints = self.report.checkpoints
        return printable(checkpoints[-1].by or "?") if checkpoints else "?"


class Workers:
    """A deployment's workers, reached through the tasks they registered, and how long to wait for them."""

    def __init__(self, tasks: AgentflowTasks, *, wait: bool, timeout_s: float) -> None:
        """Act through `tasks` (the deployment's store and key ring); wait up to `timeout_s`, unless not `wait`."""
        #: Every action goes through the client (the transport through the workers), as ``cli@<host>:<pid>``.
        self.client = FlowClient(tasks, name="cli")
        self.wait = wait
        self.timeout_s = timeout_s
        #: Says on stderr what the command waits for, and how each run goes.
        self.progress = Progress()

    @property
    def store(self) -> CheckpointStore:
        """The deployment's checkpoint store."""
        store = self.client.runner.checkpoints
        assert store is not None
        return store

    @property
    def sealer(self) -> Sealer:
        """Checks rows under the deployment's key ring."""
        return self.client.sealer

    def run(self, job: Callable[[], Awaitable[T]]) -> T:
        """Run `job` on a new event loop, then close the store; user errors become one line."""
        return _errors.run(job, close=self.store)

    async def settle(self, run_id: str) -> Settled | None:
        """Wait until the run settles, or ``--timeout`` runs out; then read it. None with ``--no-wait``.

        While it waits, stderr says for what, and each change of the run's status.
        """
        if not self.wait:
            return None
        await checked_latest(self.store, self.sealer, run_id)  # an unknown or forged run: said now
        self.progress.waiting(
            run_id,
            "a worker carries it on until it ends, pauses or waits for a decision "
            f"(up to {self.timeout_s:g} s; Ctrl-C stops the wait, not the run)",
        )
        try:
            async with polling_rows(self.progress, self.store, self.sealer, run_id):
                await self.client.settle(run_id, timeout_s=self.timeout_s)
            timed_out = False
        except TimeoutError:
            timed_out = True
        settled = Settled(await read_run(self.store, self.sealer, run_id), timed_out)
        report = settled.report
        if not report.corrupt:  # the status it settled in, had the polling not seen it yet
            status = WAITING_FOR_DECISION if report.awaiting else report.status
            self.progress.saw(run_id, status, report.step, settled.saved_by)
        self.progress.done(run_id)
        return settled

    def check(self, settled: Settled) -> None:
        """End the command when the run it waited for did not settle in time, fails its check, or needs a decision.

        Raises:
            ProblemsFound: it is still moving after ``--timeout``, a row fails its check, or a worker
                parked it on calls in doubt.
        """
        report = settled.report
        run_id = printable(repr(report.run_id))
        if report.corrupt:
            raise _errors.ProblemsFound(f"run {run_id} has rows that fail their check: {report.problems[0]}")
        if settled.timed_out:
            raise _errors.ProblemsFound(
                f"run {run_id} is still {report.status} at step {report.step} after {self.timeout_s:g} s; the "
                f"workers carry it on (agentflow runs show {printable(report.run_id)})"
            )
        if report.awaiting:
            calls = "; ".join(f"{tool} ({why})" for tool, why in report.awaiting)
            raise _errors.ProblemsFound(
                f"run {run_id} waits for a decision about calls in doubt: {calls}; check each at its system, "
                f"then: agentflow decide {printable(report.run_id)} --workers ..."
            )


def _tasks(path: str) -> AgentflowTasks:
    """The tasks at ``--workers`` `path` (the current directory is searched first, as for ``--app``).

    Raises:
        CliError: the path is malformed, does not import, or names something else; or the
            deployment signs with the demo's public key and ``--allow-demo-key`` was not given.
    """
    search_cwd()
    try:
        tasks = load_tasks(path)
    except ValueError as exc:
        raise _errors.CliError(str(exc)) from None
    key = tasks.worker.checkpoint_key
    if any(is_public(k) for k in ([key] if isinstance(key, bytes) else key)) and not demo_key_allowed():
        raise _errors.CliError(
            f"--workers {path!r} signs with the demo's public key, which anyone can sign with: it protects "
            f"nothing; to use the demo's runs, add --allow-demo-key (or set {ALLOW_DEMO_KEY_ENV}=1)"
        )
    return tasks


def load_workers(path: str, *, wait: bool, timeout_s: float) -> Workers:
    """The workers at ``--workers`` `path`, to act through.

    Raises:
        CliError: as `_tasks`.
    """
    return Workers(_tasks(path), wait=wait, timeout_s=timeout_s)


def read_through(path: str) -> tuple[Target, FlowApp]:
    """The deployment's store and key ring (as a `Target`) and its flows, at ``--workers`` `path`, to read.

    The key ring comes from the deployment's settings, which read it from
    ``$AGENTFLOW_CHECKPOINT_KEYS``: messages about a key name that variable.

    Raises:
        CliError: as `_tasks`.
    """
    worker = _tasks(path).worker
    store = worker.runner.checkpoints
    assert store is not None
    key = worker.checkpoint_key
    keys = [key] if isinstance(key, bytes) else list(key)
    return Target(store, keys, DEFAULT_KEY_ENV, f"the store of --workers {path}"), worker.flow_app
