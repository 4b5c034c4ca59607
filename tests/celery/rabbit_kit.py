"""The scale-out deployment for the Celery tests: RabbitMQ as the broker, PostgreSQL as the store.

Imported as ``rabbit_kit`` (tests/celery is on ``sys.path``). What it offers:

- `session_vhost` / the ``rabbitmq_vhost`` fixture: a virtual host of this session's own on the
  machine's RabbitMQ, made with ``rabbitmqctl`` when a module first needs it and deleted after
  the last one. In it each `Deployment` has its own queues (``q-<prefix>``) and worker names.
- `scale_out` / `scale_out_on` / the ``scale_out_deployment`` fixture: a deployment on a given
  broker whose store is PostgreSQL, each deployment with tables of its own (``<prefix>_...``),
  dropped with their functions when it closes (`close_scale_out`).
- `own_rabbitmq`: a RabbitMQ node for one test alone, started from ``rabbitmq-server`` on free
  ports with its files in the test's tmp directory; `OwnRabbit.stopped` stops and starts its
  application. It is shut down and its files removed however the test ends.

Isolation rules. The machine's RabbitMQ is shared with whatever else runs on it (another
suite, say): there the tests only make, use, inspect and delete a virtual host of their own,
and never stop, restart or reconfigure the node. A test that takes the broker away uses
`own_rabbitmq`, whose ``rabbitmqctl`` calls always name that node (``-n``). Without the
machine's RabbitMQ, or without a RabbitMQ installation to start a node from, the tests skip
(and fail under CI).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import NoReturn

import pytest
from _kit.poll import until
from _kit.ports import free_port
from _kit.stores import _remove_postgres_tables
from celery_kit import Deployment
from kombu.connection import Connection

from agentflow.exec.checkpoints.sqlalchemy._pg import drop_functions

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


#: How long a node of a test's own may take to start (here it takes a few seconds).
OWN_START_S = 60.0


def _unavailable(reason: str) -> NoReturn:
    """Skip the test for a `reason` outside its control; under CI, fail it."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must be able to start one", pytrace=False)
    pytest.skip(reason)


def _server_scripts() -> tuple[str, str] | None:
    """The ``rabbitmq-server`` and ``rabbitmqctl`` scripts to start and drive a node as the current user.

    Debian's and Ubuntu's packages put a wrapper in /usr/sbin that reruns the script as the
    ``rabbitmq`` user (who may not enter pytest's tmp directory, and whose cookie is the shared
    node's): the scripts it wraps are taken from beside it instead. None if there are none.
    """
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    server, ctl_script = shutil.which("rabbitmq-server", path=search), shutil.which("rabbitmqctl", path=search)
    if server is None or ctl_script is None:
        return None
    wrapped = Path(server).resolve()
    if wrapped.name == "rabbitmq-script-wrapper":
        server, ctl_script = str(wrapped.parent / "rabbitmq-server"), str(wrapped.parent / "rabbitmqctl")
    return server, ctl_script


class OwnRabbit:
    """A RabbitMQ node of one test (`own_rabbitmq`): its name, its AMQP URL (guest, vhost ``/``), its files."""

    def __init__(self, home: Path, server: str, ctl_script: str) -> None:
        amqp_port, dist_port = free_port(), free_port()  # this process's band: no other takes them
        self.name = f"af-{uuid.uuid4().hex[:10]}@localhost"
        self.url = f"amqp://guest:guest@127.0.0.1:{amqp_port}//"
        self.home = home
        self.server = server
        self.ctl_script = ctl_script
        self.proc: subprocess.Popen[bytes] | None = None
        # Nothing of the caller's RabbitMQ or Erlang settings: the node's own below.
        skip = ("ERL_FLAGS", "ERL_AFLAGS", "ERL_ZFLAGS")
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_") and k not in skip}
        self.env = {
            **inherited,
            "HOME": str(home),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(amqp_port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_ADDRESS": "127.0.0.1",  # if this node has to start epmd itself
            "RABBITMQ_CONF_ENV_FILE": str(home / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(home / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
            "RABBITMQ_LOG_BASE": str(home / "log"),
        }

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl -n <this node>`` with `args`; return what it printed.

        Raises:
            AssertionError: it failed (its output is in the message).
        """
        done = subprocess.run(
            [self.ctl_script, "-n", self.name, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=self.home,
        )
        assert done.returncode == 0, f"rabbitmqctl -n {self.name} {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def log(self, lines: int = 60) -> str:
        """The last `lines` of what the node printed and of its log file."""
        parts = []
        for path in [self.home / "console.log", self.home / "log" / f"{self.name}.log"]:
            text = path.read_text(errors="replace") if path.exists() else "(none)\n"
            parts.append(f"--- {path.name}\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts)

    def start(self) -> None:
        """Write its files and start ``rabbitmq-server`` in a process group of its own (output: ``console.log``)."""
        home = self.home
        home.mkdir(parents=True)
        # Its own cookie (HOME is this directory), config and plugins: nothing read from /etc/rabbitmq.
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        (home / "rabbitmq.conf").write_text("# a test node: the defaults; its listener is set by the environment\n")
        (home / "advanced.config").write_text("[].\n")
        (home / "enabled_plugins").write_text("[].\n")  # no management plugin: no HTTP port to collide on
        (home / "rabbitmq-env.conf").write_text("")  # instead of the shared node's /etc/rabbitmq/rabbitmq-env.conf
        with open(self.home / "console.log", "wb") as console:
            self.proc = subprocess.Popen(
                [self.server],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.home,
                start_new_session=True,
            )

    def started(self) -> bool:
        """Whether it has booted (``rabbitmqctl -n <node> await_startup``) and takes AMQP connections.

        Booted first: a node that booted holds its port, so the connection is to it, not to a
        server that took the port before it (then it fails to boot).

        Raises:
            RuntimeError: its ``rabbitmq-server`` exited.
        """
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"rabbitmq-server exited with status {self.proc.returncode}")
        try:
            self.ctl("await_startup", "--timeout", "10", timeout=30)  # at once if it is not registered yet
        except (AssertionError, subprocess.TimeoutExpired):
            return False
        return answers(self.url)

    async def wait_started(self, timeout_s: float = OWN_START_S) -> None:
        """Poll until it has started; else skip the test (fail under CI), with the node's log."""
        try:
            await until(lambda: asyncio.to_thread(self.started), f"{self.name} up", timeout_s=timeout_s, every=0.2)
        except (AssertionError, RuntimeError) as exc:
            _unavailable(f"a RabbitMQ node of the test's own could not start: {exc}\n{self.log()}")

    def shut_down(self) -> None:
        """Stop the node (``rabbitmqctl -n <node> stop``), kill its process group if it lingers, remove its files."""
        proc = self.proc
        try:
            if proc is not None and proc.poll() is None:
                try:
                    self.ctl("stop", timeout=30)
                    proc.wait(timeout=30)
                except (AssertionError, subprocess.SubprocessError, OSError):
                    pass  # it did not stop: killed below
        finally:
            try:
                if proc is not None and proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait(timeout=30)
            finally:
                shutil.rmtree(self.home, ignore_errors=True)

    @asynccontextmanager
    async def stopped(self, timeout_s: float = OWN_START_S) -> AsyncIterator[None]:
        """Stop this node's RabbitMQ application for the body; start it again afterwards, whatever happened."""
        await asyncio.to_thread(self.ctl, "stop_app")
        try:
            yield
        finally:
            await asyncio.to_thread(self.ctl, "start_app")
            await _up(self.url, timeout_s)


@asynccontextmanager
async def own_rabbitmq(tmp_path: Path, timeout_s: float = OWN_START_S) -> AsyncIterator[OwnRabbit]:
    """A RabbitMQ node for the body alone (its files in `tmp_path`/rabbitmq), taking connections.

    It listens on 127.0.0.1 only, on free ports, under a name of its own; afterwards, however
    the body ended, it is stopped and its files removed. Without a RabbitMQ installation, or
    when the node does not start within `timeout_s`, the test skips (fails under CI).
    """
    scripts = _server_scripts()
    if scripts is None:
        _unavailable("rabbitmq-server and rabbitmqctl are not installed: no RabbitMQ node of the test's own")
    node = OwnRabbit(tmp_path / "rabbitmq", *scripts)
    try:
        node.start()
        await node.wait_started(timeout_s)
        yield node
    finally:
        await asyncio.to_thread(node.shut_down)


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
    async with scale_out_on(tmp_path, rabbitmq_vhost, postgres_url) as dep:
        yield dep


@asynccontextmanager
async def scale_out_on(tmp_path: Path, broker_url: str, postgres_url: str) -> AsyncIterator[Deployment]:
    """A `scale_out` deployment for the body; its processes stopped and its tables dropped afterwards."""
    dep = scale_out(tmp_path, broker_url, postgres_url)
    try:
        yield dep
        await dep.aclose_clients()
    finally:
        close_scale_out(dep, postgres_url)


def scale_out(tmp_path: Path, broker_url: str, postgres_url: str) -> Deployment:
    """A `Deployment` whose workers use RabbitMQ (`broker_url`: a vhost, or a node of the test's own) and PostgreSQL."""
    return Deployment(tmp_path, broker_url=broker_url, store_url=postgres_url)


def close_scale_out(deployment: Deployment, postgres_url: str) -> None:
    """Stop the deployment's processes and drop its tables."""
    try:
        deployment.close()
    finally:
        drop_tables(postgres_url, f"{deployment.prefix}_")
