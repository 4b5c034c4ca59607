"""The demo's distributed mode: the same story over real Celery worker processes on Redis.

Two ``celery -A agentflow.demo.celery_app worker`` processes (prefork) run the ticket flow
from the Redis store; the one that holds order-2 is killed while the mail goes out; a fresh worker's
start-up ``recover_all`` finds the run once its lease lapsed, the call in doubt waits for a
decision, and every run finishes. The demo's keys stay in Redis under their own prefix
(cleared when the next demo starts) so the viewer can show what happened.

The workers' app is the demo's own (`agentflow.demo.celery_app`, built by
`agentflow.demo._celery`), so the demo runs wherever agentflow is installed with the
``celery`` extra: it needs neither the repository's ``workers/`` nor its ``config/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import redis

import agentflow
from agentflow._urls import redact
from agentflow.celery import FlowClient, RunView
from agentflow.demo._celery import LEASE_S, PREFIX_ENV, build, demo_prefix, redis_url
from agentflow.demo.story import RUN_IDS, VICTIM, effects_table, inspect_commands, mails_sent, say
from agentflow.demo.tickets import LEDGER_ENV, SLOW_ENV, Order
from agentflow.demo.worker import DEMO_KEY
from agentflow.exec.run.read import read_run
from agentflow.exec.run.view import CheckpointView, RunReport
from agentflow.exec.seal import Sealer

#: Where the ``agentflow`` package is imported from: the workers' ``PYTHONPATH`` starts with it.
PACKAGE_ROOT = Path(agentflow.__file__).resolve().parents[1]
SHOWS = ["Hamlet", "Tosca", "Cats"]


def unavailable(url: str) -> str | None:
    """Why the distributed demo cannot run here (Redis does not answer), or None."""
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        return f"Redis at {redact(url)} did not answer a ping within 1 s: {type(exc).__name__}"
    finally:
        client.close()
    return None


def clear_keys(url: str, pattern: str) -> int:
    """Delete the keys matching `pattern` (SCAN, never FLUSH); return how many."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=pattern, count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
        return len(keys)
    finally:
        client.close()


@dataclass
class Node:
    """One worker: its main process (leader of its own process group) and Celery name."""

    name: str
    proc: subprocess.Popen[bytes]
    hostname: str


class Cluster:
    """The demo's worker processes and the client's copy of their Celery app."""

    def __init__(self, folder: Path, url: str, prefix: str) -> None:
        self.folder, self.url, self.prefix = folder, url, prefix
        self.app, self.tasks = build(url, prefix)
        self.client = FlowClient(self.tasks)
        self.nodes: dict[str, Node] = {}

    def start(self, name: str, *, slow: str = "") -> Node:
        """Start ``celery -A agentflow.demo.celery_app worker`` (prefork, 2 pool processes) in its own process group."""
        env = {
            **os.environ,
            "AGENTFLOW_REDIS_URL": self.url,
            PREFIX_ENV: self.prefix,
            # Absolute: the worker runs in the folder, so a relative path (the default) would miss it.
            LEDGER_ENV: str((self.folder / "ledger.jsonl").resolve()),
            SLOW_ENV: slow,
            "PYTHONPATH": os.pathsep.join(p for p in (str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")) if p),
        }
        node_name = f"{self.prefix}-{name.lower()}"
        cmd = [sys.executable, "-m", "celery", "-A", "agentflow.demo.celery_app", "worker", "-P", "prefork", "-c", "2"]
        cmd += ["-n", f"{node_name}@%h", "-Q", self.prefix, "--without-mingle", "--without-gossip", "-l", "INFO"]
        with (self.folder / f"worker-{name}.log").open("wb") as log:
            # Its own session: the worker's main process leads a process group holding its pool.
            proc = subprocess.Popen(cmd, cwd=self.folder, env=env, stdout=log, stderr=log, start_new_session=True)
        node = self.nodes[name] = Node(name, proc, f"{node_name}@{socket.gethostname()}")
        return node

    def wait_ready(self, names: list[str], timeout_s: float = 60.0) -> None:
        """Wait until every named worker answers a ping.

        Raises:
            RuntimeError: one exited, or they did not all answer in time.
        """
        waiting = {self.nodes[n].hostname: n for n in names}
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            for name in waiting.values():
                if self.nodes[name].proc.poll() is not None:
                    raise RuntimeError(f"worker {name} exited; see {self.folder / f'worker-{name}.log'}")
            for reply in self.app.control.ping(destination=list(waiting), timeout=0.5) or []:
                for host in reply:
                    waiting.pop(host, None)
        if waiting:
            raise RuntimeError(f"worker(s) {', '.join(waiting.values())} did not answer a ping in {timeout_s:.0f}s")

    def holder(self, run_id: str, timeout_s: float = 10.0) -> tuple[Node, int]:
        """The worker whose pool process runs a superstep of `run_id` now, and that process's pid.

        Celery's ``inspect active`` lists each worker's running tasks with the pid of the pool
        process; a superstep's task id starts with ``af-<run id>-``.

        Raises:
            RuntimeError: no worker reports such a task in time.
        """
        by_host = {node.hostname: node for node in self.nodes.values() if node.proc.poll() is None}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            replies = self.app.control.inspect(destination=list(by_host), timeout=1.0).active() or {}
            for host, tasks in replies.items():
                for task in tasks:
                    if str(task.get("id", "")).startswith(f"af-{run_id}-") and host in by_host:
                        return by_host[host], int(task.get("worker_pid") or 0)
        raise RuntimeError(f"no worker reports a running superstep of {run_id} within {timeout_s:.0f}s")

    def kill(self, node: Node) -> None:
        """SIGKILL the worker's whole process group: its main process and its pool processes.

        This is what losing the machine looks like. Killing only the main process would leave
        the pool process running as an orphan, which would finish the mail and save it;
        killing only the pool process would let the main process requeue the task at once.
        """
        os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait(timeout=10)

    def drain(self, node: Node) -> None:
        """Tell a worker to stop taking tasks from the demo's queue (it stays up)."""
        self.app.control.cancel_consumer(self.prefix, destination=[node.hostname], reply=True, timeout=2.0)

    def stop_all(self) -> None:
        """Warm shutdown (SIGTERM) of every live worker; SIGKILL what is left after 15 s."""
        live = [node for node in self.nodes.values() if node.proc.poll() is None]
        for node in live:
            node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for node in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for node in self.nodes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=10)


class Watcher:
    """Reads the runs from the store and tells each new checkpoint once."""

    def __init__(self, client: FlowClient) -> None:
        self.client = client
        self.sealer = Sealer([DEMO_KEY])
        self.shown = dict.fromkeys(RUN_IDS, 0)
        self.reports: dict[str, RunReport] = {}

    async def poll(self) -> None:
        """Read every run once and narrate what changed."""
        store = self.client.tasks.worker.store
        for run_id in RUN_IDS:
            report = self.reports[run_id] = await read_run(store, self.sealer, run_id)
            for cp in report.checkpoints[self.shown[run_id] :]:
                line = _checkpoint_line(report, cp)
                if line:
                    say(f"  {run_id}: checkpoint {cp.step} ({cp.status}): {line}")
            self.shown[run_id] = len(report.checkpoints)

    async def until(self, what: str, done: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
        """Narrate until `done()` holds.

        Raises:
            TimeoutError: it did not within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            await self.poll()
            if await done():
                await self.poll()  # what changed between the last read and `done`: told too
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s:.0f}s for {what}")
            await asyncio.sleep(0.1)

    def mail_started(self) -> bool:
        """Whether the victim's ``email_tickets`` call is logged as started, with no outcome yet."""
        report = self.reports.get(VICTIM)
        calls = report.calls if report else []
        return any(c.tool == "email_tickets" and c.kind == "started" for c in calls)


def _checkpoint_line(report: RunReport, cp: CheckpointView) -> str | None:
    """What a checkpoint says: the start, or the calls of the superstep it saved (None for a claim).

    A distributed worker claims the run (a checkpoint opening its segment) before each
    superstep; the claims are left out so each superstep is told once.
    """
    if cp.what == "start":
        return "started"
    if cp.superstep is None or cp.what.startswith("claim"):
        return None
    calls = [c for c in report.calls if c.superstep == cp.superstep - 1]
    told = [f"{c.tool} {c.kind}: {c.result}" + (f", {c.note}" if c.note else "") for c in calls]
    return "; ".join(told) or "saved"


async def _start_runs(cluster: Cluster, watcher: Watcher) -> None:
    say("1. Two Celery workers start: A and B (prefork, 2 pool processes each)")
    say("   celery -A agentflow.demo.celery_app worker: the demo's own app, the ticket flow on Redis")
    cluster.start("A", slow=VICTIM)
    cluster.start("B", slow=VICTIM)
    cluster.wait_ready(["A", "B"])
    say(f"   both answer a ping (A: pid {cluster.nodes['A'].proc.pid}, B: pid {cluster.nodes['B'].proc.pid})")
    say()
    steps = "hold_seats -> charge_card -> email_tickets"
    say(f"2. The client starts {len(RUN_IDS)} ticket orders (FlowClient.start): {steps}")
    say("   Each superstep is a Celery task; the worker saves a claim, then the result (claims not shown).")
    for i, run_id in enumerate(RUN_IDS):
        await cluster.client.start("tickets", Order(show=SHOWS[i % len(SHOWS)], seats=2 + i % 3), run_id=run_id)

    async def mail_started() -> bool:
        return watcher.mail_started()

    await watcher.until(f"{VICTIM} to send its mail", mail_started)
    say(f"  {VICTIM}: email_tickets started (the demo's mail system takes 30 s for {VICTIM})")


async def _crash_and_recover(cluster: Cluster, watcher: Watcher) -> None:
    node, pid = cluster.holder(VICTIM)
    say(f"  worker {node.name} runs {VICTIM}'s superstep in its pool process {pid} (celery inspect active)")
    await asyncio.sleep(0.3)
    cluster.kill(node)
    killed = time.monotonic()
    who = f"worker {node.name} (main pid {node.proc.pid} and its pool)"
    say(f"  !! {who} killed with SIGKILL while {VICTIM} was sending its mail")
    say()
    store = cluster.tasks.worker.store
    say(f"3. Nobody renews {VICTIM}'s lease now, so no worker may take the run yet (it lapses in {LEASE_S:.0f} s).")

    async def lapsed() -> bool:
        return not await store.leases([VICTIM])

    await watcher.until(f"the lease of {VICTIM} to lapse", lapsed, timeout_s=LEASE_S + 10)
    say(f"   The lease lapsed {time.monotonic() - killed:.1f} s after the kill.")
    say("   A fresh worker C starts; on start-up it runs recover_all, which enqueues every stranded run")
    cluster.start("C")
    cluster.wait_ready(["C"])

    async def decision() -> bool:
        return (await cluster.client.status(VICTIM)).waiting_for_decision is not None

    await watcher.until(f"{VICTIM} to be recovered", decision)
    waiting = (await cluster.client.status(VICTIM)).waiting_for_decision
    say(f"  {VICTIM}: picked up by recovery: NEEDS A DECISION, in doubt: {waiting}")
    say("     (RunView.waiting: a decision on these calls; the run does nothing until someone decides)")


async def _check_and_decide(cluster: Cluster, view: RunView) -> None:
    """Look for the effects of the calls in doubt in the outside world; rerun them if none happened.

    Raises:
        RuntimeError: an effect did happen (rerunning would repeat it; a person repairs the run).
    """
    run_id = view.run_id
    tools = [call.tool for call in view.waiting.calls] if view.waiting is not None else []
    seen = {tool: mails_sent(cluster.folder / "ledger.jsonl", run_id, tool) for tool in tools}
    what = ", ".join(f"{n} " + ("mail(s) sent" if t == "email_tickets" else f"{t} effect(s)") for t, n in seen.items())
    say(f"   We check the outside world: {what} for {run_id}.", end="")
    if any(seen.values()):
        raise RuntimeError(f"{run_id}: a call in doubt had its effect; rerunning it would repeat it")
    say(" None happened, so it may run again:")
    say(f"   FlowClient.decide_in_doubt({run_id!r}, operator='demo')  (every call in doubt reruns)")
    await cluster.client.decide_in_doubt(run_id, operator="demo")


async def _decide(cluster: Cluster, watcher: Watcher) -> None:
    say()
    say("4. A call in doubt may or may not have had its effect, so agentflow ran nothing for that run.")
    # A and B both got the demo's slow-mail switch (either could have been given order-2).
    # So that the rerun does not take 30 s again on the survivor, the survivor stops taking
    # tasks (Celery's cancel_consumer; a message it was reading is requeued) and C runs it.
    for survivor in [n for n in cluster.nodes.values() if n.name != "C" and n.proc.poll() is None]:
        cluster.drain(survivor)
        say(f"   (worker {survivor.name} was started with the demo's slow-mail switch: it stops taking tasks)")
    await _check_and_decide(cluster, await cluster.client.status(VICTIM))

    async def finished() -> bool:
        views = [await cluster.client.status(r) for r in RUN_IDS]
        for view in views:  # another run the kill cut off in a non-idempotent call (rare)
            if view.waiting_for_decision:
                say(f"  {view.run_id}: NEEDS A DECISION, in doubt: {view.waiting_for_decision}")
                await _check_and_decide(cluster, view)
        return all(view.status == "done" for view in views)

    await watcher.until("every run to finish", finished)


async def _story(cluster: Cluster) -> int:
    watcher = Watcher(cluster.client)
    try:
        await _start_runs(cluster, watcher)
        await _crash_and_recover(cluster, watcher)
        await _decide(cluster, watcher)
    except (RuntimeError, TimeoutError, redis.RedisError) as exc:
        say(f"demo failed: {exc} (worker logs: {cluster.folder})")
        return 1
    finally:
        cluster.stop_all()
        await cluster.tasks.worker.store.aclose()
    say("   every run is done; the workers stop")
    say()
    return 0


def main(folder: Path, why: str = "") -> int:
    """Tell the whole story over Celery workers on Redis, files in `folder`; return the exit code."""
    url, prefix = redis_url(), demo_prefix()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "ledger.jsonl").touch()
    reason = f" ({why})" if why else ""
    say(f"agentflow demo, distributed mode: Celery workers on Redis at {redact(url)}{reason}")
    cleared = clear_keys(url, f"{prefix}:*")
    say(f"  Redis keys under '{prefix}:' (the previous demo's {cleared} keys cleared first), queue '{prefix}'")
    say(f"  outside world (ledger of effects): {folder / 'ledger.jsonl'}   worker logs: {folder}/worker-*.log")
    say()
    cluster = Cluster(folder, url, prefix)
    try:
        code = asyncio.run(_story(cluster))
    finally:
        clear_keys(url, f"{prefix}:celery:*")  # queues and results; the runs stay for the viewer
    if code:
        return code
    ok = effects_table(folder / "ledger.jsonl")
    say()
    inspect_commands(f"{redact(url)}{'&' if '?' in url else '?'}prefix={prefix}")
    return 0 if ok else 1
