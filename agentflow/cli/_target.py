"""What every command acts on: a store (from ``--store``) and the key ring (from ``--key-env``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import click

from agentflow.cli import _errors
from agentflow.cli._keys import DEFAULT_KEY_ENV, KeyProblem, key_ids, read_keys
from agentflow.cli._stores import StoreURLError, open_store
from agentflow.exec._durable_seal import Sealer
from agentflow.exec._run_read import signed_with_other_keys
from agentflow.exec._run_view import RunReport
from agentflow.exec.checkpoints._protocol import CheckpointStore

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])


@dataclass
class Target:
    """An opened store and the keys that check it."""

    store: CheckpointStore
    """The store ``--store`` names (connections open on first use)."""
    keys: list[bytes]
    """The key ring, newest first; never printed."""
    key_env: str
    """The variable the keys came from (named in messages)."""

    @property
    def sealer(self) -> Sealer:
        """Checks rows under the key ring."""
        return Sealer(self.keys)

    def run(self, job: Callable[[], Awaitable[T]]) -> T:
        """Run `job` on a new event loop, then close the store; user errors become one line."""

        async def closing() -> T:
            try:
                return await job()
            finally:
                await self.store.aclose()

        return _errors.run(closing, self.key_env)

    def wrong_key(self, reports: Sequence[RunReport]) -> str | None:
        """A message if every row that failed did so only because no key of ours signed it."""
        if not signed_with_other_keys(reports):
            return None
        ours = ", ".join(key_ids(self.keys))
        return (
            f"the runs are signed with another key than the one in ${self.key_env} (its key id: {ours}); "
            "give the key the workers sign with"
        )


def open_target(store_url: str, key_env: str, *, must_exist: bool = True) -> Target:
    """Open the store and read the keys, or end the command with one line.

    Raises:
        CliError: the URL or the key is not usable.
    """
    try:
        keys = read_keys(key_env)
        store = open_store(store_url, must_exist=must_exist)
    except (KeyProblem, StoreURLError, ImportError) as exc:
        raise _errors.explain(exc) from None
    return Target(store, keys, key_env)


def store_options(fn: F) -> F:
    """Add ``--store`` and ``--key-env`` to a command."""
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
        required=True,
        metavar="URL",
        help="The checkpoint store, e.g. sqlite:///runs.db or redis://host:6379/0 (env: AGENTFLOW_STORE).",
    )(fn)
