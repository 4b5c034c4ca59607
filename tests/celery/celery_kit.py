"""A real deployment for the Celery tests: worker processes, beat and Flower on the machine's Redis.

Imported as ``celery_kit`` (tests/celery is on ``sys.path`` under pytest's prepend import mode);
tests/celery/celery_fixtures.py makes one `Deployment` per test (the ``deployment`` fixture), with its
own key prefix and queue. A deployment may name its broker and its store apart instead
(``broker_url``, ``store_url``: RabbitMQ and PostgreSQL in `rabbit_kit`); then it touches no Redis.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from _kit.forkpopen import Forked, spawn_logged
from _kit.poll import until
from _kit.ports import free_port
from _kit.tickets import Ledger
from kombu import pools

if TYPE_CHECKING:
    from agentflow.celery import RunView
    from agentflow.exec.checkpoints.records import Lease
    from agentflow.exec.run.view import RunReport

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


class Deployment:
    """Workers, beat and Flower of one test, and a client to drive them."""

    def __init__(
        self,
        tmp_path: Path,
        redis_url: str | None = None,
        *,
        broker_url: str | None = None,
        store_url: str | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        from agentflow.celery import FlowClient
        from config import Settings
        from workers.build import build

        self.prefix = f"t{uuid.uuid4().hex[:12]}"
        self.ledger = tmp_path / "ledger.jsonl"
        self.ledger.touch()
        urls = {"redis_url": redis_url, "broker_url": broker_url, "store_url": store_url}
        self.values: dict[str, Any] = {
            "app": "celery_flows:app",
            **{name: url for name, url in urls.items() if url is not None},
            # The workers have no default key: each deployment gets one of its own.
            "checkpoint_keys": "hex:" + secrets.token_hex(32),
            "key_prefix": self.prefix,
            "queue": f"q-{self.prefix}",
            "lease_s": 2.0,
            "stale_after_s": 1.0,
            "recover_interval_s": 2.0,
            "time_limit_s": 60,
            "soft_time_limit_s": 50,
            "visibility_timeout_s": 120,
            # The machine's Redis keeps nothing on disk: a test deployment's store on purpose.
            "store_allow_volatile": True,
            **(settings or {}),
        }
        self.env = {
            **os.environ,
            **{f"AGENTFLOW_{k.upper()}": str(v) for k, v in self.values.items()},
            "AGENTFLOW_TEST_LEDGER": str(self.ledger),
            "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "tests"), str(ROOT)]),
        }
        sys.path.insert(0, str(HERE))
        self.celery_app, self.tasks = build(Settings(**self.values))
        self.client = FlowClient(self.tasks)
        self.procs: dict[str, Forked] = {}
        self.redis_url = redis_url
        self.logs = tmp_path
        #: Environment of one worker only, by name (its metrics port and directory, say).
        self.worker_env: dict[str, dict[str, str]] = {}
        #: The log level the workers started from now on log at.
        self.log_level = "INFO"
        #: Celery apps and task handles `client_for` built (closed with the deployment).
        self.others: list[tuple[Any, Any]] = []
        #: Whether this deployment owns its processes and keys (False: a `guest` on another's workers).
        self.owner = True

    def guest(self) -> Deployment:
        """A deployment for one test on this one's running workers (`keep_serving`), which it leaves running.

        It has a client side of its own (a Celery app, stores and a `FlowClient`, made for the
        test's event loop) over the same prefix, queue, keys, logs and ledger: run ids tell its
        runs apart (`effects` counts by run id). Its `close` closes that client side only.
        """
        from agentflow.celery import FlowClient
        from config import Settings
        from workers.build import build

        made = copy.copy(self)
        made.values, made.env, made.worker_env, made.others = dict(self.values), dict(self.env), {}, []
        made.celery_app, made.tasks = build(Settings(**made.values))
        made.client = FlowClient(made.tasks)
        made.owner = False
        sys.path.insert(0, str(HERE))
        return made

    def keep_serving(self, name: str, timeout: float = 30.0) -> None:
        """Have worker `name` (of this deployment's settings) running, answering and idle, for the next test.

        Started if it is not running; kept if it answers and holds no task (none under way, none
        reserved, none it keeps for later: a run a test left behind still moving); else (it died,
        does not answer, or is still busy after `timeout`) killed with its process group and
        started again.
        """
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None and self._idle(name, timeout):
            return
        if proc is not None:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        self.start_worker(name)

    def _idle(self, name: str, timeout: float) -> bool:
        """Whether worker `name` answers, with no task in hand, within `timeout` (asked again until then)."""
        target = f"{name}@{socket.gethostname()}"
        deadline = time.monotonic() + timeout
        dropped = (OSError, *self.celery_app.connection_for_write().connection_errors)
        while time.monotonic() < deadline:
            try:
                with self.celery_app.connection_for_write() as conn:  # its own, as in `wait_ready`
                    ask = self.celery_app.control.inspect(destination=[target], timeout=1.0, limit=1, connection=conn)
                    held = [ask.active(), ask.reserved(), ask.scheduled()]
            except dropped:
                continue
            if all(answer and answer.get(target) == [] for answer in held):
                return True
            time.sleep(0.1)
        return False

    def client_for(self, app: str) -> Any:
        """A `FlowClient` of this deployment whose process has the FlowApp at `app` (a deploy's other code)."""
        from agentflow.celery import FlowClient
        from config import Settings
        from workers.build import build

        celery_app, tasks = build(Settings(**{**self.values, "app": app}))
        self.others.append((celery_app, tasks))
        return FlowClient(tasks)

    def start_worker_of(self, name: str, app: str) -> Forked:
        """Start worker `name` with the FlowApp at `app` (its deploy's flows) instead of the kit's."""
        self.worker_env[name] = {**self.worker_env.get(name, {}), "AGENTFLOW_APP": app}
        return self.start_worker(name)

    def set_delay(self, low: float, high: float) -> None:
        self.env["AGENTFLOW_TEST_DELAY"] = f"{low},{high}"

    def break_tools(self) -> None:
        """Make the ticket tools of the workers started from now on raise ValueError before their effect.

        They read their delay from ``AGENTFLOW_TEST_DELAY`` on each call, and ``broken`` is no
        number: hold_seats, charge_card and the others raise, so a run that calls one fails.
        """
        self.env["AGENTFLOW_TEST_DELAY"] = "broken,broken"

    def unacked(self) -> set[str]:
        """The ids of the tasks whose messages a worker took and has not acknowledged (nor rejected) yet."""
        assert self.redis_url is not None, "a deployment on another broker keeps no Redis hash of unacked messages"
        client = redis.Redis.from_url(self.redis_url)
        try:
            held = client.hvals(f"{self.prefix}:celery:unacked")
        finally:
            client.close()
        return {json.loads(raw)[0]["headers"]["id"] for raw in held}

    def set_lease(self, lease_s: float) -> None:
        """Give the workers started from now on leases of `lease_s` (the kit's are 2 s)."""
        self.configure(lease_s=lease_s)

    def configure(self, **values: Any) -> None:
        """Give the workers (and beat) started from now on these settings (`config.Settings` names)."""
        self.values.update(values)
        self.env.update({f"AGENTFLOW_{name.upper()}": str(value) for name, value in values.items()})

    def _spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> Forked:
        """Start ``celery -A workers <args>`` as `name`, forked warm (`celery_main`), its output in ``<name>.log``."""
        proc = spawn_logged(
            HERE / "celery_main.py", list(args), self.logs / f"{name}.log", env={**self.env, **(env or {})}, cwd=ROOT
        )
        self.procs[name] = proc
        return proc

    def start_worker(self, name: str, concurrency: int = 2, *, wait: bool = True) -> Forked:
        proc = self._spawn(
            name, "worker", "-P", "prefork", "-c", str(concurrency), "-n", f"{name}@%h",
            "-Q", self.values["queue"], "-E", "--without-mingle", "--without-gossip", "-l", self.log_level,
            env=self.worker_env.get(name),
        )  # fmt: skip
        if wait:
            self.wait_ready(name)
        return proc

    def wait_ready(self, name: str, timeout: float = 30.0) -> None:
        """Wait until worker `name` answers a ping.

        Each ping goes over a connection of its own, which kombu connects (retrying as it does,
        with its own back-off). A broker that drops it mid-ping is asked again on a new one
        until `timeout`; the last error is in the failure. (CI saw RabbitMQ reset a ping's
        connection while the Celery tests ran on two processes at once, as pytest 9.2 made
        them: RabbitMQ closes every connection of a virtual host it deletes, and each
        process deleted its own at its end.)
        """
        target = f"{name}@{socket.gethostname()}"
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        dropped = (OSError, *self.celery_app.connection_for_write().connection_errors)
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise AssertionError(f"worker {name} exited: {(self.logs / f'{name}.log').read_text()[-3000:]}")
            try:
                with self.celery_app.connection_for_write() as conn:  # its own: a dropped one goes with it
                    conn.ensure_connection(max_retries=3, interval_start=0.2, interval_step=0.2)
                    if self.celery_app.control.ping(destination=[target], timeout=0.5, connection=conn):
                        return
            except dropped as exc:
                last = exc
        raise AssertionError(f"worker {name} did not answer a ping within {timeout}s (last error: {last!r})")

    def start_beat(self) -> Forked:
        return self._spawn("beat", "beat", "-s", str(self.logs / "beat-schedule"), "-l", "INFO")

    def start_flower(self, basic_auth: str, timeout: float = 30.0) -> str:
        """Start Flower on a free loopback port with basic auth; return its base URL once it answers."""
        port = free_port()
        name = "flower"
        self._spawn(
            name, "flower", "--address=127.0.0.1", f"--port={port}", env={"FLOWER_BASIC_AUTH": basic_auth}
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise AssertionError(f"flower exited: {(self.logs / f'{name}.log').read_text()[-3000:]}")
            try:
                direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
                with direct.open(f"{url}/healthcheck", timeout=1) as resp:
                    if resp.status == 200:
                        return url
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"flower did not answer /healthcheck within {timeout}s")

    def children(self, name: str) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.procs[name].pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    async def freeze_pool(self, name: str) -> list[int]:
        """SIGSTOP worker `name`'s pool processes once a sweep ran there (its start's, with no other worker up).

        Its main process goes on taking messages from the broker (as many as its prefetch
        allows) and hands each to a pool process that never starts it. Returns their pids.
        """

        def swept() -> bool:
            lines = self.log(name).splitlines()
            return any("Task agentflow.recover_all[" in line and "succeeded" in line for line in lines)

        await until(swept, f"worker {name}'s start-up sweep ending", timeout_s=30.0, every=0.05)
        pool = self.children(name)
        for pid in pool:
            os.kill(pid, signal.SIGSTOP)
        return pool

    async def until_taken(self, run_id: str, cause: str, timeout_s: float = 20.0) -> str:
        """Wait until a worker's main process took a `cause` message of the run from the broker; its task id."""
        prefix = f"af-{run_id}-"

        def taken() -> str | None:
            return next((t for t in self.unacked() if t.startswith(prefix) and f"-{cause}-" in t), None)

        found: str = await until(taken, f"a {cause} message of {run_id} taken", timeout_s=timeout_s, every=0.02)
        return found

    def kill(self, name: str) -> None:
        """SIGKILL the worker's main process only (its pool children are left to notice)."""
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def kill_group(self, name: str) -> None:
        """SIGKILL the worker's whole process group: its main process and every pool child, at once."""
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)  # started in a session of its own: the group is the worker's
        proc.wait(timeout=10)

    def log(self, name: str) -> str:
        """What a worker (or beat, or Flower) wrote to its log so far."""
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def refusals(self, name: str, cause: str, run_id: str) -> list[str]:
        """The WARNING lines in which worker `name` refused a `cause` message (or a row) of the run."""
        said = f"refused to act on run {run_id} (a {cause} message"
        return [line for line in self.log(name).splitlines() if "WARNING" in line and said in line]

    async def report(self, run_id: str) -> RunReport:
        """The run as the read model shows it (every row checked), with its lease."""
        from agentflow.exec.run.read import read_run

        worker = self.tasks.worker
        return await read_run(worker.store, worker.sealer, run_id)

    async def until_held(self, run_id: str, timeout_s: float = 20.0) -> Lease:
        """Wait until someone holds the run's lease (a worker's superstep is under way); return it."""
        store = self.tasks.worker.store

        async def held() -> Lease | None:
            return (await store.leases([run_id])).get(run_id)

        return await until(held, f"a worker taking the lease of {run_id}", timeout_s=timeout_s, every=0.05)

    async def until_effect(self, tool: str, run_id: str, timeout_s: float = 20.0) -> None:
        """Wait until `tool` had its effect in the run (the ledger is written inside the tool)."""
        await until(lambda: self.effects()[(tool, run_id)], f"{tool}'s effect in {run_id}", timeout_s=timeout_s)

    async def until_started(self, run_id: str, tool: str, timeout_s: float = 20.0) -> None:
        """Wait until a call of `tool` is logged as started, with no result yet (it is running)."""

        async def started() -> bool:
            return any(c.tool == tool and c.kind == "started" for c in (await self.report(run_id)).calls)

        await until(started, f"a call of {tool} started in {run_id}", timeout_s=timeout_s, every=0.05)

    async def parked_run(self, worker: str = "w1", successor: str = "w2", successor_app: str | None = None) -> str:
        """A ticket run parked on charge_card in doubt: its worker was SIGKILLed right after the charge.

        The worker `worker` runs the run with slow tools and is killed (its whole process
        group) once charge_card had its effect; `successor` starts (fast tools; with the
        FlowApp at `successor_app`, another deploy's code) and looks at the run on its start
        (or, if the dead worker's lease was still live, when it ended): the charge is in
        doubt and not idempotent, so it parks the run. Returns the run id.
        """
        return await self.parked("flow", worker, successor, successor_app)

    async def parked(
        self, kind: str, worker: str = "w1", successor: str = "w2", successor_app: str | None = None
    ) -> str:
        """A run of `kind` (`_kit.parked.PARKED`: a flow run, a tool loop, an agent run) parked on its charge in doubt.

        As `parked_run`, for any kind: the worker dies inside the charge, the next one parks the run.
        """
        from _kit.agents import PROMPT
        from _kit.parked import PARKED

        from agentflow.models import Message

        self.set_delay(0.8, 0.8)  # the charge waits this long after its effect: the kill lands inside it
        self.start_worker(worker)
        run_id, tool = f"{self.prefix}-parked-{kind}", PARKED[kind].tool
        if kind == "flow":
            await self.client.start("tickets", {"show": "parked"}, run_id=run_id)
        elif kind == "loop":
            await self.client.start_loop("charges", [Message.user("parked")], run_id=run_id)
        else:
            await self.client.start_agent("orders", PROMPT, run_id=run_id)
        await self.until_effect(tool, run_id)
        self.kill_group(worker)
        self.set_delay(0.0, 0.0)
        if successor_app is None:
            self.start_worker(successor)
        else:
            self.start_worker_of(successor, successor_app)
        view = await self.client.settle(run_id, timeout_s=30)
        assert view.status == "running" and view.waiting_for_decision, view
        assert tool in view.waiting_for_decision
        assert self.effects()[(tool, run_id)] == 1
        return run_id

    def effects(self) -> Counter[tuple[str, str]]:
        """How often each (tool, run id) effect happened, in every worker process."""
        return Ledger(self.ledger).by_run()

    async def wait_all(self, run_ids: list[str], timeout_s: float = 120.0) -> dict[str, RunView]:
        views = await asyncio.gather(*(self.client.settle(r, timeout_s=timeout_s, poll_s=0.2) for r in run_ids))
        return dict(zip(run_ids, views, strict=True))

    async def aclose_clients(self) -> None:
        """Close the store clients this process used, on the loop that used them (no socket left to the GC)."""
        for tasks in [self.tasks, *(t for _, t in self.others)]:
            await tasks.worker.store.aclose()
        if self.client.runner.checkpoints is not None:
            await self.client.runner.checkpoints.aclose()

    def close_sockets(self) -> None:
        """Close what this process opened through the app: broker connections (sends, pings) and the result
        backend's (``AsyncResult.get``: a client and a pub/sub). `Celery.close` closes neither."""
        for other, _ in self.others:
            other.pool.force_close_all()
            _forget_pools(other)
            other.close()
        app = self.celery_app
        app.pool.force_close_all()
        _forget_pools(app)
        backend = app.backend
        consumer = getattr(backend, "result_consumer", None)
        if consumer is not None:
            consumer.stop()
        client = getattr(backend, "client", None)
        if client is not None:
            client.connection_pool.disconnect()
        app.close()

    def close(self) -> None:
        self.close_sockets()
        if not self.owner:  # a guest: the workers and the keys are its host's
            sys.path.remove(str(HERE))
            return
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        if self.redis_url is not None:
            client = redis.Redis.from_url(self.redis_url)
            keys = list(client.scan_iter(match=f"{self.prefix}*", count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])
            client.close()
        sys.path.remove(str(HERE))


def _forget_pools(app: Any) -> None:
    """Drop the app's closed broker pools from kombu's process-wide groups.

    The groups key a pool by the connection's settings: the next app on the same broker
    (another test on the same RabbitMQ vhost) would be handed the closed pool.
    """
    conn = app.connection_for_write()
    try:
        for group in (pools.producers, pools.connections):
            with suppress(KeyError):
                del group[conn]
    finally:
        conn.release()


#: The states a superstep task ends in (Celery's own and agentflow's: `agentflow.celery._task_states`).
ENDED = frozenset({"SUCCESS", "FAILURE", "SKIPPED", "REFUSED", "PAUSED", "NEEDS_DECISION", "RECOVERED", "CANCELLED"})


async def ended(sent: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    """The result of a superstep task once it ended, in whatever state (polled: `.get()` waits only for SUCCESS
    and FAILURE, and agentflow ends a task that did nothing SKIPPED or REFUSED)."""

    def over() -> bool:
        return bool(sent.state in ENDED)  # a read of the result backend: on a thread, off the loop

    try:
        await until(lambda: asyncio.to_thread(over), f"task {sent.id} ending", timeout_s=timeout_s, every=0.05)
        info: dict[str, Any] = sent.info
        return info
    finally:
        sent.backend.remove_pending_result(sent)  # no subscription left to its channel (as `.get()` leaves none)
