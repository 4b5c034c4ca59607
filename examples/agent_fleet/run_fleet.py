"""Run the agent fleet end to end: workers with beat, Flower, runs, a worker killed in the charge, a decision.

What a person would do by hand, as commands, in order (``make example`` runs this):

1. start two workers (``celery -A fleet_app worker``, the first with ``-B``: beat, which
   recovers stranded runs) and Flower (``celery -A fleet_app flower``);
2. start an agent run that charges order A1 (`FlowClient.start_agent`); the worker charging
   it is SIGKILLed inside the charge tool, after the card was charged and before the result
   was saved; a supervisor starts it again;
3. start a second run (order B2), which the fleet carries on meanwhile;
4. watch A1 park on the charge in doubt (`FlowClient.settle`: ``view.waiting`` names the
   call): nothing reran it, since running it again would charge twice;
5. check the card's statement (the ledger), and decide: the charge happened, with its result
   (``agentflow decide RUN --workers fleet_app:tasks --call ID=happened:JSON``);
6. read both outputs (`FlowClient.result`), and check every order was charged exactly once.

Settings are the deployment's ``AGENTFLOW_*`` variables; this script picks a fresh key, key
prefix and queue, short leases (so the example takes seconds), and ``AGENTFLOW_REDIS_URL`` from
the environment (default ``redis://127.0.0.1:6379/0``). It removes its keys at the end and
exits non-zero, saying what went wrong, if anything did.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
STARTED = time.monotonic()


class Failed(Exception):
    """Something the example checks did not hold (the message says what)."""


def say(text: str) -> None:
    print(f"[{time.monotonic() - STARTED:5.1f}s] {text}", flush=True)


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """Poll `check` until it returns something true; that value (fails naming `what` after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise Failed(f"timed out after {timeout_s:.0f} s waiting for {what}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Processes:
    """The fleet's processes, each a command in a session of its own (its worker and pool die together)."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs, self.env = logs, env
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [str(BIN / argv[0]), *argv[1:]],
                cwd=HERE,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.running[name] = proc
        return proc

    def holding(self, pid: int) -> str:
        """The name of the process whose session `pid` belongs to."""
        session = os.getsid(pid)
        return next(name for name, proc in self.running.items() if proc.pid == session)

    def kill(self, name: str) -> None:
        proc = self.running.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.running.values():
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.running.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.running.clear()

    def tail(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in sorted(self.logs.glob("*.log")))


def deployment(work: Path) -> dict[str, str]:
    """The fleet's environment: what every worker, Flower and client process reads."""
    prefix = f"fleet{secrets.token_hex(4)}"
    return {
        **os.environ,
        "AGENTFLOW_REDIS_URL": os.environ.get("AGENTFLOW_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "AGENTFLOW_CHECKPOINT_KEYS": "hex:" + secrets.token_hex(32),  # in production: from your secret store
        "AGENTFLOW_KEY_PREFIX": prefix,
        "AGENTFLOW_QUEUE": prefix,
        # Short leases and a quick beat, so that a recovery takes seconds here (defaults: 30 s, 60 s).
        "AGENTFLOW_LEASE_S": "3",
        "AGENTFLOW_STALE_AFTER_S": "1",
        "AGENTFLOW_RECOVER_INTERVAL_S": "2",
        # A local Redis that keeps nothing on disk is refused unless allowed: allowed for this example only.
        "AGENTFLOW_STORE_ALLOW_VOLATILE": "1",
        "FLOWER_BASIC_AUTH": "operator:" + secrets.token_urlsafe(16),
        "FLEET_LEDGER": str(work / "charges.jsonl"),
        "FLEET_CRASH_ON": "A1",
        "FLEET_CRASH_MARK": str(work / "crashed.pid"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
    }


def worker(procs: Processes, name: str, queue: str, *extra: str) -> None:
    argv = ["celery", "-A", "fleet_app", "worker", "-n", f"{name}@%h", "-Q", queue, "-c", "1", "-E", "-l", "INFO"]
    procs.start(name, *argv, *extra)


def ready(app: Any, names: list[str]) -> Callable[[], bool]:
    targets = [f"{name}@{socket.gethostname()}" for name in names]

    def check() -> bool:
        answers = app.control.ping(destination=targets, timeout=0.5)
        return {name for answer in answers for name in answer} >= set(targets)

    return check


def flower_get(port: int, path: str, auth: str) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    with urllib.request.urlopen(request, timeout=2) as answer:
        body = answer.read().decode()
    return json.loads(body) if path.startswith("/api") else body


def flower_up(port: int, auth: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return bool(flower_get(port, "/healthcheck", auth) == "OK")
        except OSError:
            return False

    return check


def charges(env: dict[str, str]) -> list[dict[str, Any]]:
    ledger = Path(env["FLEET_LEDGER"])
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


async def story(procs: Processes, env: dict[str, str], work: Path) -> None:
    from fleet_app import app, tasks  # the client's copy of the workers' app: the same module, the same settings

    from agentflow.celery import FlowClient

    queue, auth = env["AGENTFLOW_QUEUE"], env["FLOWER_BASIC_AUTH"]
    port = free_port()
    worker(procs, "w1", queue, "-B", "-s", str(work / "celerybeat-schedule"))
    worker(procs, "w2", queue)
    procs.start("flower", "celery", "-A", "fleet_app", "flower", "--address=127.0.0.1", f"--port={port}")
    wait_for("the workers to answer", ready(app, ["w1", "w2"]), 60)
    wait_for("Flower to answer", flower_up(port, auth), 60)
    say(f"fleet up: workers w1 (with beat) and w2, Flower at http://127.0.0.1:{port} (user operator)")

    client = FlowClient(tasks)
    try:
        a1 = await client.start_agent("support", "Charge order A1", run_id=f"order-A1-{queue}")
        say(f"started {a1}")
        mark = Path(env["FLEET_CRASH_MARK"])
        pid = int(wait_for("a worker to charge order A1", lambda: mark.exists() and mark.read_text(), 30))
        victim = procs.holding(pid)
        procs.kill(victim)
        say(f"SIGKILLed worker {victim} inside the charge tool (card charged, result never saved)")
        worker(procs, victim, queue, *(["-B", "-s", str(work / "celerybeat-schedule")] if victim == "w1" else []))
        say(f"worker {victim} restarted, as a supervisor would")

        b2 = await client.start_agent("support", "Charge order B2", run_id=f"order-B2-{queue}")
        say(f"started {b2}")

        view = await client.settle(a1, timeout_s=60)
        expect(view.waiting is not None and view.waiting.what == "decision", f"{a1} should wait for a decision: {view}")
        assert view.waiting is not None
        (call,) = view.waiting.calls
        expect(call.tool == "charge", f"the call in doubt should be the charge, not {call.tool}")
        say(f"{a1} parked, {view.status}: {call.tool}({json.dumps(call.args)}) in doubt ({call.why})")

        made = [c for c in charges(env) if c["order"] == "A1"]
        expect(len(made) == 1, f"order A1 should have been charged once before the decision, not {len(made)} times")
        result = f"charged {made[0]['amount']} EUR for A1"
        say(f"the card's statement shows the charge: deciding it happened, with result {result!r}")
        decide = [
            "agentflow", "decide", a1, "--workers", "fleet_app:tasks",
            "--call", f"{call.call_id}=happened:{json.dumps(result)}", "--as", "operator", "--no-wait",
        ]  # fmt: skip
        say("$ " + " ".join(decide[:-1]))
        decided = subprocess.run(
            [str(BIN / decide[0]), *decide[1:]], cwd=HERE, env=env, capture_output=True, text=True, timeout=60
        )
        expect(decided.returncode == 0, f"agentflow decide failed: {decided.stdout}{decided.stderr}")
        # In process, the same decision: client.decide_in_doubt(a1, calls={call.call_id: agentflow.Happened(result)})

        for run_id in (a1, b2):
            view = await client.settle(run_id, timeout_s=60)
            expect(view.status == "done", f"{run_id} should be done, not {view.status} ({view.error or view.waiting})")
            say(f"{run_id} done: {await client.result(run_id)!r}")
        expect((await client.result(a1)) == "Done: charged 90 EUR for A1.", "order A1's output is wrong")
        expect((await client.result(b2)) == "Done: charged 35 EUR for B2.", "order B2's output is wrong")

        per_order = {order: sum(c["order"] == order for c in charges(env)) for order in ("A1", "B2")}
        say(f"charges per order: {per_order}")
        expect(per_order == {"A1": 1, "B2": 1}, f"each order should be charged exactly once: {per_order}")
        seen = flower_get(port, "/api/tasks", auth)
        names = sorted({str(task.get("name")) for task in seen.values()})
        say(f"Flower saw {len(seen)} tasks: {', '.join(names)}")
    finally:
        await tasks.worker.store.aclose()


def clear(env: dict[str, str]) -> None:
    import redis

    client = redis.Redis.from_url(env["AGENTFLOW_REDIS_URL"])
    try:
        for key in client.scan_iter(match=f"{env['AGENTFLOW_KEY_PREFIX']}*", count=1000):
            client.delete(key)
    finally:
        client.close()


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="agent-fleet-"))
    env = deployment(work)
    os.environ.update(env)  # this process is the fleet's client: it reads the same settings
    sys.path.insert(0, str(HERE))
    procs = Processes(work, env)
    try:
        asyncio.run(story(procs, env, work))
    except Failed as exc:
        print(f"FAILED: {exc}\n{procs.tail()}", file=sys.stderr)
        return 1
    finally:
        procs.stop_all()
        clear(env)
    say("ok: the run killed in its charge finished with the right output, and nothing was charged twice")
    return 0


if __name__ == "__main__":
    sys.exit(main())
