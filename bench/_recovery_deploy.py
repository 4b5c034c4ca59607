"""The deployment the recovery benchmark (`bench.recovery`) kills: ``celery -A workers`` processes, default timings.

Workers are ``celery -A workers worker --pool=prefork --concurrency=1 --without-mingle
--without-gossip`` on one queue (and, as every worker, the sweep queue and the flow
version's queue), beat is ``celery -A workers beat``; every timing setting is at its default
whatever the environment says. Each process is started in a session of its own, so its
process group is the worker (main process and pool process), which the benchmark kills in
whole or in part.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench._suite import Context

ROOT = Path(__file__).resolve().parent.parent
#: How often the benchmark reads the store, the broker or a log while it waits for something.
POLL_S = 0.02
#: The settings that pace recovery; the benchmark gives workers and beat their defaults.
DEFAULTS = ("lease_s", "recheck_margin_s", "recover_interval_s", "stale_after_s", "recover_lock_s")


async def until(check: Callable[[], bool | Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Poll `check` (sync or async) every `POLL_S` until it is true.

    Raises:
        TimeoutError: it was not within `timeout_s` (the message says `what`).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if await found if inspect.isawaitable(found) else found:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(POLL_S)


class Deployment:
    """The workers and beat of one benchmark, with the default timing settings."""

    def __init__(self, ctx: Context, redis_url: str) -> None:
        from agentflow.celery import FlowClient
        from config import Settings
        from workers.build import build

        self.tmp = ctx.tmp
        self.gates = ctx.tmp / "gates"
        self.gates.mkdir()
        self.redis_url = redis_url
        self.values: dict[str, Any] = {
            "app": "bench._recovery_app:app",
            "redis_url": redis_url,
            "checkpoint_keys": "hex:" + ctx.key.hex(),
            "key_prefix": ctx.tag,
            "queue": f"{ctx.tag}-q",
            "store_allow_volatile": True,  # the machine's Redis keeps nothing on disk: said so
        }
        # The defaults of every timing setting, whatever the environment or a .env file says.
        for name in DEFAULTS:
            self.values[name] = Settings.model_fields[name].default
        self.settings = Settings(**self.values)
        self.celery_app, self.tasks = build(self.settings)
        self.client = FlowClient(self.tasks)
        self.store = self.tasks.worker.store
        self.env = {
            **os.environ,
            **{f"AGENTFLOW_{k.upper()}": str(v) for k, v in self.values.items()},
            "BENCH_RECOVERY_GATE": str(self.gates),
            "PYTHONPATH": str(ROOT),
        }
        self.host = socket.gethostname()
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        """Live workers by node name (``name@host``)."""
        self.beat: subprocess.Popen[bytes] | None = None
        self.dead: list[subprocess.Popen[bytes]] = []
        self.starts = 0

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{name}.log", "wb") as log:  # the child keeps its own copy
            return subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "workers", *args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start_workers(self, count: int) -> list[str]:
        """Start `count` workers at once, as a supervisor restarts dead ones; their node names."""
        names = []
        for _ in range(count):
            self.starts += 1
            name = f"rec{self.starts}-{secrets.token_hex(2)}"
            argv = ["worker", "-l", "INFO", "-E", "-n", f"{name}@%h", "--pool=prefork", "--concurrency=1"]
            argv += ["--without-mingle", "--without-gossip", "-Q", self.values["queue"]]
            node = f"{name}@{self.host}"
            self.workers[node] = self._spawn(name, *argv)
            names.append(node)
        return names

    def start_beat(self) -> None:
        self.beat = self._spawn("beat", "beat", "-l", "INFO", "-s", str(self.tmp / "beat-schedule"))

    def wait_ready(self, nodes: list[str], timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = set(nodes)
        while waiting:
            dead = [n for n in waiting if self.workers[n].poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"workers {sorted(dead or waiting)} did not come up:\n{self.log_tails(dead)}")
            for reply in self.celery_app.control.ping(destination=sorted(waiting), timeout=0.5) or []:
                waiting -= set(reply)

    def log(self, node: str) -> str:
        """What worker `node` wrote to its log so far."""
        return (self.tmp / f"{node.split('@')[0]}.log").read_text(errors="replace")

    def connected(self, node: str) -> bool:
        """Whether worker `node` has connected to the broker (its log says so)."""
        return "Connected to " in self.log(node)

    def idle(self, nodes: list[str]) -> bool:
        """Whether workers `nodes` hold no task (none under way, reserved or held for later) and none is queued.

        Once they are up, that means each start's sweep ran (a sweep sent again for later is
        held by the worker that took it). A dead worker's messages stay in the broker's hash of
        unacknowledged ones for an hour: only the live workers are asked.
        """
        import redis

        prefix, queue = f"{self.values['key_prefix']}:celery:", self.values["queue"]
        client = redis.Redis.from_url(self.redis_url)
        try:
            if sum(client.llen(prefix + name) for name in (queue, f"{queue}.sweep", f"{queue}.held.v1")):
                return False
        finally:
            client.close()
        ask = self.celery_app.control.inspect(destination=nodes, timeout=1.0)
        answers = [ask.active(), ask.reserved(), ask.scheduled()]
        return all(answer and all(answer.get(node) == [] for node in nodes) for answer in answers)

    def node_of(self, owner: str) -> str:
        """The worker whose pool process holds a lease as `owner` (``<name>:<pid>``).

        By the pid and its parent, not by the name: a worker process whose first task was
        its start-up ``recover_all`` holds leases as ``agentflow@<host>:<pid>``, not under
        its node name (the name is learnt from the first superstep, after the runner that
        names the leases was made).
        """
        pid = int(owner.rsplit(":", 1)[1])
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return f"? ({owner})"
        mains = {proc.pid: node for node, proc in self.workers.items()}
        return mains.get(parent, mains.get(pid, f"? ({owner})"))

    def pool_of(self, node: str) -> list[int]:
        """The pids of worker `node`'s pool processes (its main process's children)."""
        return _children(self.workers[node].pid)

    def kill(self, nodes: list[str]) -> dict[str, float]:
        """SIGKILL each worker's process group (main and pool process); the wall time of each kill."""
        killed = {}
        for node in nodes:
            proc = self.workers.pop(node)
            killed[node] = time.time()
            os.killpg(proc.pid, signal.SIGKILL)
            self.dead.append(proc)
        return killed

    def kill_main(self, node: str) -> float:
        """SIGKILL worker `node`'s main process alone (its pool processes die with it: PR_SET_PDEATHSIG); when."""
        proc = self.workers.pop(node)
        pool = _children(proc.pid)
        killed = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        self.dead.append(proc)
        for pid in pool:  # the kernel ends them with their parent; a stopped one is ended here just the same
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return killed

    def unacked(self) -> set[str]:
        """The ids of the tasks whose messages a worker's main process took and has not acknowledged."""
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            held = client.hvals(f"{self.values['key_prefix']}:celery:unacked")
        finally:
            client.close()
        return {json.loads(raw)[0]["headers"]["id"] for raw in held}

    def reap(self) -> None:
        for proc in self.dead:
            proc.wait(timeout=10)
        self.dead.clear()

    def log_tails(self, nodes: list[str] | None = None, chars: int = 2500) -> str:
        names = [n.split("@")[0] for n in nodes] if nodes else None
        paths = sorted(self.tmp.glob("*.log"))
        chosen = [p for p in paths if names is None or p.stem in names]
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in chosen)

    async def close(self) -> None:
        from bench._services import redis_unlink_prefix

        for proc in [*self.workers.values(), *([self.beat] if self.beat else [])]:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.dead.append(proc)
        self.reap()
        await self.store.aclose()
        await redis_unlink_prefix(self.redis_url, self.values["key_prefix"])


def _children(pid: int) -> list[int]:
    """The pids of process `pid`'s children."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(child) for child in out.stdout.split()]
