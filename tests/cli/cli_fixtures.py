"""The CLI tests' fixtures: a fresh copy of runs_kit's store per test, and `agentflow`, the command in-process."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import runs_kit
from click.testing import CliRunner, Result

from agentflow.cli._group import cli


@pytest.fixture(scope="session")
def built_db(tmp_path_factory):
    return runs_kit.build_once(tmp_path_factory)


@pytest.fixture
def db(built_db, tmp_path):
    """A fresh copy of the runs store for one test."""
    runs_kit.REFUNDS.clear()
    return runs_kit.copy_db(built_db, tmp_path / "runs.db")


@pytest.fixture
def url(db):
    return f"sqlite:///{db}"


class Agentflow:
    """Runs the ``agentflow`` command in-process with the kit's key in the environment.

    The kit's runs are signed with the demo's public key, so the demo key is allowed
    (``AGENTFLOW_ALLOW_DEMO_KEY=1``) unless `env` says otherwise (``None`` unsets it).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.runner = CliRunner()

    def __call__(
        self,
        *args: str,
        key: str | None = runs_kit.KEY_TEXT,
        store: bool = True,
        env: Mapping[str, str | None] | None = None,
        input: str | None = None,
    ) -> Result:
        environ: dict[str, str | None] = {
            "AGENTFLOW_CHECKPOINT_KEYS": key,
            "AGENTFLOW_STORE": self.url if store else None,
            **runs_kit.ALLOW_DEMO_KEY,
        }
        environ.update(env or {})
        result = self.runner.invoke(cli, list(args), env=environ, input=input, catch_exceptions=False)
        return result


@pytest.fixture
def agentflow(url):
    return Agentflow(url)
