"""Store URLs: each backend the CLI names by URL, with agentflow's own parameters."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import pytest
import runs_kit
from click.testing import Result
from runs_kit import one_line_error

from agentflow._urls import redact
from agentflow.exec.checkpoints import SQLAlchemyCheckpointStore, SQLiteCheckpointStore
from agentflow.exec.checkpoints.urls import StoreURLError, open_store, sqlite_path


async def _pause_a_refund(url: str) -> None:
    store = open_store(url, must_exist=False)
    try:
        await runs_kit.app.runner(store, runs_kit.KEY).run(
            runs_kit.refunds, {"order": "o-9", "amount": 5}, run_id="r-9"
        )
    finally:
        await store.aclose()


async def _forget(url: str) -> None:
    store = open_store(url, must_exist=False)
    try:
        await store.delete("r-9")
    finally:
        await store.aclose()


def listed(agentflow: Callable[..., Result], url: str) -> str:
    result = agentflow("runs", "list", "--store", url)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_sqlite_urls_name_relative_and_absolute_files():
    assert str(sqlite_path("sqlite:///runs.db")) == "runs.db"
    assert str(sqlite_path("sqlite:////abs/path/runs.db")) == "/abs/path/runs.db"
    assert isinstance(open_store("sqlite:///new.db", must_exist=False), SQLiteCheckpointStore)
    with pytest.raises(StoreURLError, match="there is no database file"):
        open_store("sqlite:///surely-not-here.db")


def test_sql_urls_make_the_sqlalchemy_store():
    store = open_store("sqlite+aiosqlite:///x.db?table_prefix=t_", must_exist=False)
    assert isinstance(store, SQLAlchemyCheckpointStore)
    with pytest.raises(StoreURLError, match="table_prefix must match"):
        open_store("sqlite+aiosqlite:///x.db?table_prefix=Bad-Prefix", must_exist=False)


def test_redact_hides_passwords_only():
    assert redact("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact("postgresql+asyncpg://u:pw@h/db?x=1") == "postgresql+asyncpg://u:***@h/db?x=1"
    assert redact("sqlite:///runs.db") == "sqlite:///runs.db"


def test_a_sqlalchemy_sqlite_store_with_a_table_prefix(agentflow, tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'sql.db'}?table_prefix=tenant7_"
    runs_kit.in_thread(lambda: _pause_a_refund(url))
    assert "r-9" in listed(agentflow, url) and "paused" in listed(agentflow, url)
    # another tenant's tables in the same file hold nothing
    assert listed(agentflow, url.replace("tenant7_", "tenant8_")).strip() == "no runs in this store"
    result = agentflow("resume", "r-9", "--app", "runs_kit:app", "--approve", "--store", url)
    assert result.exit_code == 0, result.output
    assert agentflow("verify", "--all", "--store", url).exit_code == 0


@pytest.mark.redis
def test_a_redis_store_with_a_prefix(agentflow, redis_url, unique_prefix):
    url = f"{redis_url}?prefix={unique_prefix()}"
    runs_kit.in_thread(lambda: _pause_a_refund(url))
    try:
        assert "r-9" in listed(agentflow, url)
        assert "r-9" not in listed(agentflow, f"{redis_url}?prefix={unique_prefix()}")
        assert agentflow("verify", "r-9", "--store", url).exit_code == 0
    finally:
        runs_kit.in_thread(lambda: _forget(url))


def test_a_bad_redis_ttl_is_one_line(agentflow):
    assert "ttl_s must be" in one_line_error(agentflow("runs", "list", "--store", "redis://h/0?ttl_s=soon"))


@pytest.mark.postgres
def test_a_postgres_store_with_a_table_prefix(agentflow, postgres_url, unique_prefix):
    prefix = f"{unique_prefix()}_"
    url = f"{postgres_url}?table_prefix={prefix}"
    runs_kit.in_thread(lambda: _pause_a_refund(url))
    try:
        assert "r-9" in listed(agentflow, url)
        assert agentflow("verify", "--all", "--store", url).exit_code == 0
    finally:
        runs_kit.in_thread(lambda: _drop_tables(postgres_url, prefix))


async def _drop_tables(url: str, prefix: str) -> None:
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        rows = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)", prefix
        )
        for row in rows:
            await conn.execute(f'DROP TABLE IF EXISTS "{row["tablename"]}" CASCADE')
    finally:
        await conn.close()
