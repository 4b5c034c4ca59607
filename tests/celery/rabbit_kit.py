"""The scale-out deployment for the Celery tests: RabbitMQ as the broker, PostgreSQL as the store.

Imported as ``rabbit_kit`` (tests/celery is on ``sys.path``). Isolation: one RabbitMQ virtual
host per test session (made with ``rabbitmqctl`` when a module first needs it, deleted after
the last one), and in it each
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
from _kit.stores import _remove_postgres_tables
from celery_kit import Deployment
from kombu.connection import Connection

from agentflow.exec.checkpoints._sql_pg import drop_functions

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
        with Connection(url, connect_timeout=2) as conn:  # type: ignore[no-untyped-call]  # kombu has no hints
            conn.ensure_connection(max_retries=1)
        return True
    except Exception:  # refused, reset, or the app is stopped: not up
        return False


#: The session's virtual host (its URL) and how many fixtures use it: made by the first, deleted by the last.
_VHOST: dict[str, int] = {}


@contextmanager
def session_vhost() -> Iterator[str]:
    """The session's virtual host (``af-<hex>``, the guest user may use it); deleted when its last user is done.

    Each test module's fixture enters it: the first makes it, the last one out deletes it.
    """
    if not _VHOST:
        if not answers(RABBITMQ + "/"):
            reason = f"RabbitMQ at {RABBITMQ} is not reachable"
            if os.environ.get("CI"):
                pytest.fail(f"{reason}; CI must start it", pytrace=False)
            pytest.skip(reason)
        name = f"af-{uuid.uuid4().hex[:10]}"
        ctl("add_vhost", name)
        _VHOST[f"{RABBITMQ}/{name}"] = 0
        ctl("set_permissions", "-p", name, USER, ".*", ".*", ".*")
    url = next(iter(_VHOST))
    _VHOST[url] += 1
    try:
        yield url
    finally:
        _VHOST[url] -= 1
        if not _VHOST[url]:
            del _VHOST[url]
            ctl("delete_vhost", url.rsplit("/", 1)[1])


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
    """Drop the tables and the functions of a deployment's store (`table_prefix`: its ``<prefix>_``)."""

    async def drop_functions_too() -> None:
        import asyncpg

        conn = await asyncpg.connect(postgres_url.replace("postgresql+asyncpg://", "postgresql://", 1))
        try:
            for statement in drop_functions(table_prefix):
                await conn.execute(statement)
        finally:
            await conn.close()

    _remove_postgres_tables(postgres_url.replace("postgresql+asyncpg://", "postgresql://", 1), table_prefix)
    with ThreadPoolExecutor(max_workers=1) as pool:  # safe while an event loop runs on this thread
        pool.submit(lambda: asyncio.run(drop_functions_too())).result()


@pytest.fixture(scope="session")
def rabbitmq_vhost() -> Iterator[str]:
    """The session's virtual host (`session_vhost`): its URL."""
    with session_vhost() as url:
        yield url


@pytest.fixture
async def scale_out_deployment(tmp_path: Path, rabbitmq_vhost: str, postgres_url: str) -> AsyncIterator[Deployment]:
    """A deployment on RabbitMQ (the session's vhost) and PostgreSQL (tables of its own), closed afterwards."""
    dep = scale_out(tmp_path, rabbitmq_vhost, postgres_url)
    try:
        yield dep
        await dep.aclose_clients()
    finally:
        close_scale_out(dep, postgres_url)


def scale_out(tmp_path: Path, broker_url: str, postgres_url: str) -> Deployment:
    """A `Deployment` whose workers use RabbitMQ (`broker_url`: the session's vhost) and PostgreSQL."""
    return Deployment(tmp_path, broker_url=broker_url, store_url=postgres_url)


def close_scale_out(deployment: Deployment, postgres_url: str) -> None:
    """Stop the deployment's processes and drop its tables."""
    try:
        deployment.close()
    finally:
        drop_tables(postgres_url, f"{deployment.prefix}_")
