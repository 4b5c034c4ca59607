"""The demo's narrator: starts worker processes, kills one mid-mail, recovers, tells the story.

Embedded mode: the SQLite store and worker processes on this machine, no server needed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from agentflow.demo.tickets import LEDGER_ENV, SLOW_ENV, ledger
from agentflow.demo.worker import DEMO_KEY

RUN_IDS = ["order-1", "order-2", "order-3"]
VICTIM = "order-2"


def say(text: str = "", end: str = "\n") -> None:
    """Print one line of the story (or the start of one, with ``end=""``)."""
    print(text, end=end, flush=True)


def _worker(folder: Path, *args: str, slow: str = "") -> subprocess.Popen[str]:
    env = {**os.environ, LEDGER_ENV: str(folder / "ledger.jsonl"), SLOW_ENV: slow}
    cmd = [sys.executable, "-m", "agentflow.demo.worker", "--db", str(folder / "runs.db"), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)


def _describe(line: dict[str, Any]) -> str | None:
    kind, run = line["event"], line.get("run_id")
    if kind == "checkpoint.saved":
        return f"  {run}: checkpoint {line['step']} saved ({line['status']})"
    if kind == "tool.started":
        return f"  {run}: {line['tool']} started"
    if kind == "tool.finished":
        return f"  {run}: {line['tool']} done"
    if kind == "tool.replayed":
        return f"  {run}: {line['tool']} replayed from the log (not run again)"
    if kind == "run.recovered":
        replayed, rerun = len(line["replayed"]), len(line["rerun"])
        return f"  {run}: recovered from checkpoint {line['step']}: {replayed} call(s) replayed, {rerun} rerun"
    if kind == "held":
        return (
            f"  {run}: held by {line['owner']} (the killed worker) for {line['left']} s more; "
            "nothing may act on it until its lease lapses, so B waits"
        )
    if kind == "decision":
        calls = ", ".join(f"{tool} ({why})" for tool, why in line["calls"])
        return f"  {run}: NEEDS A DECISION, in doubt: {calls}"
    if kind == "result":
        return f"  {run}: {line['status']}: {line['note']}"
    if kind == "error":
        return f"  {run}: {line['error']}"
    return None


def _narrate(proc: subprocess.Popen[str], kill_when: str | None = None) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = json.loads(raw)
        lines.append(line)
        text = _describe(line)
        if text:
            say(text)
        if kill_when and (line["event"], line.get("tool"), line["run_id"]) == (
            "tool.started",
            "email_tickets",
            kill_when,
        ):
            time.sleep(0.3)
            proc.send_signal(signal.SIGKILL)
            say(f"  !! worker {proc.pid} killed with SIGKILL while {kill_when} was sending its mail")
    proc.wait()
    proc.stdout.close()
    return lines


def main(folder: Path, why: str = "") -> int:
    """Tell the whole story in `folder`; return the exit code. `why` says why this mode was chosen."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    reason = f"; {why}" if why else ""
    say(f"agentflow demo, embedded mode: SQLite store and worker processes on this machine (no server needed{reason})")
    say(f"  store: {folder / 'runs.db'}   outside world (ledger of effects): {folder / 'ledger.jsonl'}")
    say()
    say(f"1. Worker A starts {len(RUN_IDS)} ticket orders: hold_seats -> charge_card -> email_tickets")
    _narrate(_worker(folder, "run", *RUN_IDS, slow=VICTIM), kill_when=VICTIM)
    say()
    say("2. Worker B starts up and recovers every unfinished run (recover_all)")
    lines = _narrate(_worker(folder, "recover"))
    doubts = [line for line in lines if line["event"] == "decision"]
    if doubts:
        say()
        say("3. A call in doubt may or may not have had its effect, so agentflow ran nothing for that run.")
        mails = mails_sent(folder / "ledger.jsonl")
        say(f"   We check the mail system: {mails} mail(s) sent for {VICTIM}. None went out, so it may run again:")
        say("   recover_all(flow, rerun_in_doubt=True)")
        _narrate(_worker(folder, "recover", "--rerun-in-doubt"))
    say()
    ok = effects_table(folder / "ledger.jsonl")
    say()
    inspect_commands(f"sqlite:///{(folder / 'runs.db').absolute()}")
    return 0 if ok else 1


def mails_sent(ledger_path: Path, run_id: str = VICTIM, tool: str = "email_tickets") -> int:
    """How often the outside world saw `tool`'s effect for `run_id` (by default: mails sent)."""
    return sum(1 for e in ledger(ledger_path) if e["tool"] == tool and e["run_id"] == run_id)


def effects_table(ledger_path: Path) -> bool:
    """Print how often each effect happened per run; True if every charge and mail happened once."""
    effects = Counter((e["run_id"], e["tool"]) for e in ledger(ledger_path))
    say("What happened in the outside world (each effect once, though a worker died):")
    say(f"  {'run':<10}{'hold_seats':>12}{'charge_card':>13}{'email_tickets':>15}")
    ok = True
    for run_id in RUN_IDS:
        row = [effects[(run_id, t)] for t in ("hold_seats", "charge_card", "email_tickets")]
        ok = ok and row[1] == 1 and row[2] == 1
        say(f"  {run_id:<10}{row[0]:>12}{row[1]:>13}{row[2]:>15}")
    return ok


def inspect_commands(store_url: str) -> None:
    """Print the commands that show the runs just told about (the viewer's last)."""
    key = f"AGENTFLOW_CHECKPOINT_KEYS=hex:{DEMO_KEY.hex()}"
    store = f"--store {shlex.quote(store_url)}"
    say("The runs are signed with the demo's public key. Inspect them (history, call log, recovered mark):")
    say(f"  {key} .venv/bin/agentflow runs show {VICTIM} {store} --allow-demo-key")
    say(f"  {key} .venv/bin/agentflow viewer {store} --app agentflow.demo.tickets:app --allow-demo-key")
