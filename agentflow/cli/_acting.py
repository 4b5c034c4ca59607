"""What an acting command acts with: the app and store here, or a deployment's workers (``--workers``).

Every acting command (``recover``, ``resume``, ``decide``, ``retry``, ``cancel``, ``fork``)
takes its options through `acting`: ``--store``, ``--key-env`` and ``--app`` to act in this
process (`Here`: it runs the tools itself, holding each run's lease as ``cli@<host>:<pid>``),
or ``--workers MODULE:ATTR`` to act through the deployment's Celery workers (`Workers`: the
deployment's store, key ring and flows; the tools run on the workers). Both sign ``--as NAME``
into each decision. One mode or the other: an option of the other mode given on the command
line is refused (`refuse_beside_workers`). A command that waits for the run it moved says on
stderr what it waits for and how the run goes (`Here.moving` here, `Workers.settle` there).
"""

from __future__ import annotations

import functools
import getpass
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import click

from agentflow._app import FlowApp
from agentflow._events import Events
from agentflow.cli._apps import import_app
from agentflow.cli._progress import Progress
from agentflow.cli._target import (
    Target,
    explicit,
    open_target,
    refuse_beside_workers,
    store_options,
    workers_option,
)
from agentflow.cli._watch import moving_here
from agentflow.exec.run.lease import process_owner
from agentflow.flow import FlowRunner
from agentflow.runs import Runs

if TYPE_CHECKING:
    from agentflow.cli._workers import Workers

#: Where ``--as`` is read from when it is not given.
OPERATOR_ENV: Final = "AGENTFLOW_OPERATOR"
#: The longest operator name taken.
MAX_OPERATOR: Final = 200
#: How long a command through the workers waits for the run to settle, by default (seconds).
DEFAULT_TIMEOUT_S: Final = 60.0


def default_operator() -> str:
    """``--as`` when not given: the login name (``$AGENTFLOW_OPERATOR`` is read by click first)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (a container without one): the runner's own name is used
        return ""


def _check_operator(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    name = value.strip()
    if not name and value:
        raise click.BadParameter("give a name (it is signed into each decision)")
    if len(name) > MAX_OPERATOR or not name.isprintable():
        raise click.BadParameter(f"a name of at most {MAX_OPERATOR} printable characters, please")
    return name


@dataclass
class Here:
    """Acting in this process: the app's flows and tools over the store, holding runs as this command."""

    app: FlowApp
    target: Target
    runs: Runs
    """Acts on each run by its id, whatever its kind (the in-process transport), as ``cli@<host>:<pid>``."""
    events: Events
    """The runner's event hub: what it says of each run it moves (recorded into the runs' streams too)."""
    progress: Progress
    """Where the command says, on stderr, which run it moves and how the run goes."""

    @property
    def runner(self) -> FlowRunner:
        """The flow runner (`recover --flow` recovers every run of one flow with it)."""
        return self.runs.runner

    def moving(self) -> AbstractAsyncContextManager[None]:
        """While inside, say on stderr which run this process moves and each change of its status."""
        return moving_here(self.events, self.progress)


@dataclass
class Acting:
    """How a command acts (here, or through the workers) and who decides."""

    operator: str | None
    """``--as``: signed into each decision (None: the holder's own name)."""
    workers: Workers | None
    """The deployment's workers (``--workers``), or None to act here."""
    store_url: str | None = None
    key_env: str = ""
    app_path: str | None = None
    workers_path: str | None = None
    """``--workers`` as given (what a hint repeats), or None to act here."""

    def here(self) -> Here:
        """Import the app and open the store (acting here; the app first, as its errors say more).

        Raises:
            CliError: the app, the URL or the key is not usable.
        """
        assert self.store_url is not None and self.app_path is not None
        app = import_app(self.app_path)
        target = open_target(self.store_url, self.key_env)
        # It acts on stored runs someone may be following: their events go into the runs' streams.
        events = Events(record=True)
        runner = app.runner(target.store, target.keys, owner=process_owner("cli"), events=events)
        return Here(app, target, Runs(app, runner), events, Progress())


def _resolve(ctx: click.Context, options: dict[str, Any], waits: bool) -> Acting:
    workers_path: str | None = options.pop("workers_path")
    store_url: str | None = options.pop("store_url")
    app_path: str | None = options.pop("app_path")
    timeout_s: float = options.pop("timeout_s", DEFAULT_TIMEOUT_S)
    wait = not options.pop("no_wait", False)
    acting = Acting(options.pop("operator") or None, None, store_url, options.pop("key_env"), app_path)
    if workers_path:
        refuse_beside_workers(
            ctx,
            {"store_url": "--store acts in this process", "app_path": "--app acts in this process"},
            "through the deployment's workers (with its store, key and flows)",
        )
        from agentflow.cli._workers import load_workers  # imports agentflow.celery: only with --workers

        acting.workers = load_workers(workers_path, wait=wait, timeout_s=timeout_s)
        acting.workers_path = workers_path
        return acting
    if waits and (explicit(ctx, "no_wait") or explicit(ctx, "timeout_s")):
        raise click.UsageError("--no-wait and --timeout go with --workers (here, the command acts to the end)")
    if not store_url:
        raise click.UsageError(
            "give --store URL (or $AGENTFLOW_STORE) to act here, or --workers MODULE:ATTR to act through the workers"
        )
    if not app_path:
        raise click.UsageError(
            "give --app MODULE:ATTR (the FlowApp with the run's flow and tools) to act here, "
            "or --workers MODULE:ATTR to act through the workers"
        )
    return acting


def _options(fn: Callable[..., None], waits: bool) -> Callable[..., None]:
    if waits:
        fn = click.option(
            "--no-wait", is_flag=True, help="With --workers: report what was enqueued, do not wait for the run."
        )(fn)
        fn = click.option(
            "--timeout",
            "timeout_s",
            type=click.FloatRange(min=0),
            default=DEFAULT_TIMEOUT_S,
            show_default=True,
            metavar="SECONDS",
            help="With --workers: how long to wait for the run to settle (done, paused, failed, or waiting).",
        )(fn)
    fn = click.option(
        "--as",
        "operator",
        metavar="NAME",
        envvar=OPERATOR_ENV,
        default=default_operator,
        show_default=f"${OPERATOR_ENV}, else your login name",
        callback=_check_operator,
        help=f"Who decides: signed into each decision this command stores (env: {OPERATOR_ENV}).",
    )(fn)
    fn = workers_option(
        fn, what="Act through the deployment's Celery workers (its store, key and flows; the tools run on the workers)"
    )
    fn = click.option(
        "--app", "app_path", metavar="MODULE:ATTR", help="Act here: the FlowApp with the run's flow and tools."
    )(fn)
    return store_options(fn, required=False)


def acting(*, waits: bool = True) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the acting options; it is called with an `Acting` first, then its own parameters.

    Args:
        waits: the command enqueues work for the workers, so ``--timeout`` and ``--no-wait`` apply.
    """

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def command(**options: Any) -> None:
            how = _resolve(click.get_current_context(), options, waits)
            fn(how, **options)

        return _options(command, waits)

    return decorate
