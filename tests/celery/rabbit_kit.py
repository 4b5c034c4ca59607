"""The scale-out deployment for the Celery tests: RabbitMQ as the broker, PostgreSQL as the store.

Imported as ``rabbit_kit`` (tests/celery is on ``sys.path``). Isolation: one RabbitMQ virtual
host per test session (made with ``rabbitmqctl``, deleted at the end), and in it each
`Deployment` its own queues (``q-<prefix>``) and worker names; in PostgreSQL each deployment
its own tables (``<prefix>_...``), dropped with their functions when it closes.

`broker_stopped` stops the RabbitMQ application (``rabbitmqctl stop_app``) and always starts
it again, even when the test fails inside it. Without RabbitMQ the tests skip (fail under CI).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
from _kit.poll import until
from celery_kit import Deployment
from kombu import Connection

#: The machine's RabbitMQ (no virtual host: each session adds its own).
RABBITMQ = os.environ.get("AGENTFLOW_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672")
USER = RABBITMQ.split("://", 1)[1].split(":", 1)[0]


def ctl(*args: str, timeout: float = 60.0) -> str:
    """Run ``rabbitmqctl`` with `args`; return what it printed.

    Raises:
        AssertionError: it failed (its output is in the message).
    """
    done = subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"rabbitmqctl {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def answers(url: str) -> bool:
    """Whether the broker at `url` takes an AMQP connection now."""
    try:
        with Connection(url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1)
        return True
    except Exception:  # refused, reset, or the app is stopped: not up
        return False


@contextmanager
def session_vhost() -> Iterator[str]:
    """A virtual host of its own (``af-<hex>``) the guest user may use; yields its URL and deletes it after."""
    if not answers(RABBITMQ + "/"):
        reason = f"RabbitMQ at {RABBITMQ} is not reachable"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must start it", pytrace=False)
        pytest.skip(reason)
    name = f"af-{uuid.uuid4().hex[:10]}"
    ctl("add_vhost", name)
    try:
        ctl("set_permissions", "-p", name, USER, ".*", ".*", ".*")
        yield f"{RABBITMQ}/{name}"
    finally:
        ctl("delete_vhost", name)


async def _up(url: str, timeout_s: float) -> None:
    await until(lambda: asyncio.to_thread(answers, url), "RabbitMQ taking connections", timeout_s=timeout_s, every=0.5)


@asynccontextmanager
async def broker_stopped(url: str, timeout_s: float = 60.0) -> AsyncIterator[None]:
    """Stop the RabbitMQ application for the body; start it again afterwards, whatever happened."""
    await asyncio.to_thread(ctl, "stop_app")
    try:
        yield
    finally:
        await asyncio.to_thread(ctl, "start_app")
        await _up(url, timeout_s)


def drop_tables(postgres_url: str, table_prefix: str) -> None:
    """Drop the tables and the functions whose names start with `table_prefix` (a deployment's)."""

    async def drop() -> None:
        import asyncpg

        conn = await asyncpg.connect(postgres_url.replace("postgresql+asyncpg://", "postgresql://", 1))
        try:
            found = await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)",
                table_prefix,
            )
            for row in found:
                await conn.execute(f'DROP TABLE IF EXISTS "{row["tablename"]}" CASCADE')
            functions = await conn.fetch(
                "SELECT p.oid::regprocedure::text AS sig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = current_schema() AND starts_with(p.proname, $1)",
                table_prefix,
            )
            for row in functions:
                await conn.execute(f"DROP FUNCTION IF EXISTS {row['sig']}")
        finally:
            await conn.close()

    with ThreadPoolExecutor(max_workers=1) as pool:  # safe while an event loop runs on this thread
        pool.submit(lambda: asyncio.run(drop())).result()


def scale_out(tmp_path: Path, broker_url: str, postgres_url: str) -> Deployment:
    """A `Deployment` whose workers use RabbitMQ (`broker_url`: the session's vhost) and PostgreSQL."""
    return Deployment(tmp_path, broker_url=broker_url, store_url=postgres_url)


def close_scale_out(deployment: Deployment, postgres_url: str) -> None:
    """Stop the deployment's processes and drop its tables."""
    try:
        deployment.close()
    finally:
        drop_tables(postgres_url, f"{deployment.prefix}_")
