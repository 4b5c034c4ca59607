"""What every command acts on: a store (from ``--store``) and the key ring (from ``--key-env``).

A `Target` holds the keys and may hold a URL with a password: its `repr` and `str` show the
store's URL with the password redacted and the keys' public ids, never a key.

``--workers MODULE:ATTR`` (`workers_option`) names a deployment instead, whose settings
give the store and the key ring; an option that names this process's own store (or app)
beside it is refused by one rule (`refuse_beside_workers`), for the acting and the
reading commands alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar

import click
from click.core import ParameterSource

from agentflow._urls import redact
from agentflow.cli import _errors
from agentflow.cli._keys import ALLOW_DEMO_KEY_ENV, DEFAULT_KEY_ENV, KeyProblem, key_ids, read_keys
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.urls import StoreURLError, open_store
from agentflow.exec.seal import Sealer

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])

#: Where ``--allow-demo-key`` leaves its value in the command's context (``ctx.meta``).
ALLOW_DEMO_KEY: Final = "agentflow.allow_demo_key"
#: Where ``--workers`` is read from when it is not given.
WORKERS_ENV: Final = "AGENTFLOW_WORKERS"


@dataclass(repr=False)
class Target:
    """An opened store and the keys that check it."""

    store: CheckpointStore
    """The store ``--store`` names (connections open on first use)."""
    keys: list[bytes] = field(repr=False)
    """The key ring, newest first; never printed."""
    key_env: str
    """The variable the keys came from (named in messages)."""
    label: str = ""
    """The store's URL with any password redacted (safe to show)."""

    def __repr__(self) -> str:
        ids = ", ".join(key_ids(self.keys))
        return f"Target(store={self.label or type(self.store).__name__!r}, key_env={self.key_env!r}, key_ids=[{ids}])"

    __str__ = __repr__

    @property
    def sealer(self) -> Sealer:
        """Checks rows under the key ring."""
        return Sealer(self.keys)

    def run(self, job: Callable[[], Awaitable[T]]) -> T:
        """Run `job` on a new event loop, then close the store; user errors become one line."""
        return _errors.run(job, self.key_env, close=self.store)


def demo_key_allowed() -> bool:
    """Whether the command was told to accept the demo's public key (``--allow-demo-key``)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(ALLOW_DEMO_KEY))


def open_target(store_url: str, key_env: str, *, must_exist: bool = True, allow_demo_key: bool | None = None) -> Target:
    """Open the store and read the keys, or end the command with one line.

    Args:
        store_url: the ``--store`` URL.
        key_env: the variable holding the keys (``--key-env``).
        must_exist: refuse a SQLite file that does not exist yet.
        allow_demo_key: accept the demo's public key; None: as the command's
            ``--allow-demo-key`` (or ``AGENTFLOW_ALLOW_DEMO_KEY``) says.

    Raises:
        CliError: the URL or the key is not usable.
    """
    allow = demo_key_allowed() if allow_demo_key is None else allow_demo_key
    try:
        keys = read_keys(key_env, allow_demo_key=allow)
        store = open_store(store_url, must_exist=must_exist)
    except (KeyProblem, StoreURLError, ImportError) as exc:
        raise _errors.explain(exc) from None
    return Target(store, keys, key_env, redact(store_url))


def _remember_demo_key(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta[ALLOW_DEMO_KEY] = value
    return value


def store_options(fn: F, *, required: bool = True) -> F:
    """Add ``--store``, ``--key-env`` and ``--allow-demo-key`` to a command (the last one is read by `open_target`).

    `required` False: the command can act without a store of its own (through the workers).
    """
    fn = click.option(
        "--allow-demo-key",
        is_flag=True,
        envvar=ALLOW_DEMO_KEY_ENV,
        expose_value=False,
        callback=_remember_demo_key,
        help=f"Accept the demo's public key, to look at the demo's runs (env: {ALLOW_DEMO_KEY_ENV}=1).",
    )(fn)
    fn = click.option(
        "--key-env",
        default=DEFAULT_KEY_ENV,
        show_default=True,
        metavar="NAME",
        help="Variable holding the checkpoint key (hex:..., base64:... or text; comma-separated to rotate).",
    )(fn)
    return click.option(
        "--store",
        "store_url",
        envvar="AGENTFLOW_STORE",
        required=required,
        metavar="URL",
        help="The checkpoint store, e.g. sqlite:///runs.db or redis://host:6379/0 (env: AGENTFLOW_STORE).",
    )(fn)


def workers_option(fn: F, *, what: str) -> F:
    """Add ``--workers MODULE:ATTR`` (or ``$AGENTFLOW_WORKERS``) to a command, as the parameter ``workers_path``.

    `what` says what the command does with the deployment (its help text).
    """
    return click.option(
        "--workers",
        "workers_path",
        envvar=WORKERS_ENV,
        metavar="MODULE:ATTR",
        help=f"{what}: the AgentflowTasks the workers registered, e.g. workers.celery_app:tasks (env: {WORKERS_ENV}).",
    )(fn)


def explicit(ctx: click.Context, name: str) -> bool:
    """Whether the parameter `name` was given on the command line (not read from the environment or a default)."""
    return ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE


def refuse_beside_workers(ctx: click.Context, options: Mapping[str, str], workers_do: str) -> None:
    """Refuse an option of this process's own store or app given on the command line beside ``--workers``.

    Args:
        ctx: the command's context (``workers_path`` is set).
        options: parameter name -> what its option does (``"--store acts in this process"``).
        workers_do: what the command does through the workers instead.

    Raises:
        click.UsageError: one of `options` was given on the command line.
    """
    source = "--workers" if explicit(ctx, "workers_path") else f"${WORKERS_ENV}"
    for name, does in options.items():
        if explicit(ctx, name):
            raise click.UsageError(f"{does}, {source} {workers_do}: give one or the other")
