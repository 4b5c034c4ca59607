"""What every command acts on: a store (from ``--store``) and the key ring (from ``--key-env``).

A `Target` holds the keys and may hold a URL with a password: its `repr` and `str` show the
store's URL with the password redacted and the keys' public ids, never a key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, TypeVar

import click

from agentflow._display import redact
from agentflow.cli import _errors
from agentflow.cli._keys import ALLOW_DEMO_KEY_ENV, DEFAULT_KEY_ENV, KeyProblem, key_ids, read_keys
from agentflow.cli._stores import StoreURLError, open_store
from agentflow.exec._durable_seal import Sealer
from agentflow.exec.checkpoints._protocol import CheckpointStore

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])

#: Where ``--allow-demo-key`` leaves its value in the command's context (``ctx.meta``).
ALLOW_DEMO_KEY: Final = "agentflow.allow_demo_key"


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
