"""Every ```python block in docs/ and in the README is executed.

Each block is a complete program, run in its own process from a temporary folder. A
```text block right after a paragraph ending "It prints:" must equal the output of the
python block before it.

A block that calls ``make_app(`` (an app module of a fleet, `agentflow.celery.make_app`) runs
with a deployment's settings in its environment (a fresh key, the machine's Redis URL, which
making the app does not contact), as a worker's would have them.

A block that imports the repository's ``workers`` (a client of distributed mode) runs
against a real Celery worker: the test starts one ``celery -A workers worker`` process
running the demo's ticket flow on the machine's Redis, under a key prefix and a queue of
its own, gives the block the same ``AGENTFLOW_*`` settings, and stops the worker and
deletes its keys afterwards.

Blocks of other languages are not run: ```sh blocks are shell commands (some need Docker
or a server), ```text blocks are output or signatures, ```mermaid blocks are diagrams.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)
#: A block that imports the workers' wiring needs a worker to talk to.
NEEDS_WORKERS = re.compile(r"^\s*(from workers[.\s]|import workers\b)", re.M)
#: A block that makes a fleet's app reads the deployment's settings from its environment.
NEEDS_SETTINGS = re.compile(r"\bmake_app\(")
#: The app the docs' client examples expect the workers to run.
WORKERS_APP = "agentflow.demo.tickets:app"
TIMEOUT_S = 120


def blocks() -> list[tuple[str, int, str, str | None]]:
    found = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:  # the README's example runs as written too
        text = page.read_text()
        fences = list(FENCE.finditer(text))
        for i, match in enumerate(fences):
            if match.group(1) != "python":
                continue
            expected = None
            if i + 1 < len(fences) and fences[i + 1].group(1) == "text":
                between = text[match.end() : fences[i + 1].start()]
                if between.strip().endswith("It prints:"):
                    expected = fences[i + 1].group(2)
            line = text[: match.start()].count("\n") + 1
            name = str(page.relative_to(DOCS)) if page.is_relative_to(DOCS) else page.name
            found.append((name, line, match.group(2), expected))
    return found


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Warm shutdown of a process started in a session of its own; SIGKILL its group if it lingers."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _clear(redis_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


@contextmanager
def one_worker(redis_url: str, logs: Path) -> Iterator[tuple[dict[str, str], subprocess.Popen[bytes]]]:
    """One ``celery -A workers worker`` on its own prefix and queue; yield its environment and process."""
    prefix = f"docs{uuid.uuid4().hex[:12]}"
    env = {name: value for name, value in os.environ.items() if not name.startswith("AGENTFLOW_")}
    env |= {
        "AGENTFLOW_APP": WORKERS_APP,
        "AGENTFLOW_REDIS_URL": redis_url,
        "AGENTFLOW_CHECKPOINT_KEYS": "hex:" + secrets.token_hex(32),
        "AGENTFLOW_KEY_PREFIX": prefix,
        # The machine's Redis keeps nothing on disk, as the docs' local set-up says to allow.
        "AGENTFLOW_STORE_ALLOW_VOLATILE": "1",
        "AGENTFLOW_QUEUE": prefix,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    argv = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-P", "prefork", "-c", "1"]
    argv += ["-n", f"{prefix}@%h", "-Q", prefix, "--without-mingle", "--without-gossip", "-l", "WARNING"]
    with (logs / "worker.log").open("wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield env, proc
    finally:
        _stop(proc)
        _clear(redis_url, prefix)


def run_block(
    code: str, cwd: Path, env: dict[str, str] | None = None, worker: subprocess.Popen[bytes] | None = None
) -> tuple[int, str, str]:
    """Run the block as a program; fail at once if the worker it talks to exits under it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + TIMEOUT_S
    while proc.poll() is None:
        if worker is not None and worker.poll() is not None:
            proc.kill()
            proc.communicate()
            pytest.fail(f"the worker exited under the example:\n{(cwd / 'worker.log').read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.communicate()
            pytest.fail(f"the example ran longer than {TIMEOUT_S} s")
        time.sleep(0.05)
    stdout, stderr = proc.communicate()
    return proc.returncode, stdout, stderr


@pytest.mark.parametrize(
    ("page", "line", "code", "expected"),
    # A block that needs a worker runs it on Redis.
    [pytest.param(*block, marks=pytest.mark.redis if NEEDS_WORKERS.search(block[2]) else ()) for block in blocks()],
    ids=lambda v: str(v)[:30],
)
def test_docs_example_runs_as_written(request, tmp_path, page, line, code, expected):
    if NEEDS_WORKERS.search(code):
        with one_worker(request.getfixturevalue("redis_url"), tmp_path) as (env, worker):
            code_, stdout, stderr = run_block(code, tmp_path, env, worker)
        where = f"\nworker log:\n{(tmp_path / 'worker.log').read_text()[-3000:]}"
    elif NEEDS_SETTINGS.search(code):
        env = {name: value for name, value in os.environ.items() if not name.startswith("AGENTFLOW_")}
        env |= {
            "AGENTFLOW_CHECKPOINT_KEYS": "hex:" + secrets.token_hex(32),
            "AGENTFLOW_REDIS_URL": "redis://127.0.0.1/0",
        }
        code_, stdout, stderr = run_block(code, tmp_path, env)
        where = ""
    else:
        code_, stdout, stderr = run_block(code, tmp_path)
        where = ""
    assert code_ == 0, f"{page}:{line} failed:\n{stderr}{where}"
    if expected is not None:
        assert stdout == expected, f"{page}:{line} printed something else"


def client_block() -> str:
    """The distributed client's example in distributed.md."""
    found = [code for page, _, code, _ in blocks() if page == "distributed.md" and NEEDS_WORKERS.search(code)]
    assert len(found) == 1, "distributed.md should hold one client example"
    return found[0]


@pytest.mark.redis
def test_the_cli_reads_a_compose_deployments_runs_as_distributed_md_says(request, tmp_path):
    # Issue 15: nothing said how to point the CLI at compose's Redis. The commands the docs
    # give run in a container, whose environment holds the deployment's settings: here, the
    # same settings as the worker's, and the same shell script each command hands to sh -c.
    text = (DOCS / "distributed.md").read_text()
    scripts = re.findall(r"^docker compose exec worker sh -c '([^']*)'$", text, re.M)
    assert [script.split()[:2] for script in scripts] == [["agentflow", "runs"]] * 2, scripts
    with one_worker(request.getfixturevalue("redis_url"), tmp_path) as (env, worker):
        code, _, stderr = run_block(client_block(), tmp_path, env, worker)
        assert code == 0, stderr
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])

        def sh(script: str) -> str:
            done = subprocess.run(
                ["sh", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, f"{script}\n{done.stdout}{done.stderr}"
            return done.stdout

        listed = [line.split() for line in sh(scripts[0]).splitlines() if " tickets " in line]
        assert len(listed) == 1 and "done" in listed[0], listed
        shown = sh(scripts[1].replace("RUN_ID", listed[0][0]))
        assert f"run {listed[0][0]} " in shown and "status done" in shown, shown


def test_every_page_with_code_is_covered():
    # A guard against the extractor silently finding nothing
    found = blocks()
    assert any(page == "durable-runs.md" for page, *_ in found)
    assert any(page == "README.md" for page, *_ in found)  # the README's snippet runs as written
    # the distributed client's example is a python block, run against a worker
    assert "FlowClient(tasks)" in client_block()


def test_no_python_hides_in_another_kind_of_block():
    # Issue 15: the distributed client was written in a ```text block, so nothing ran it
    looks_like_python = re.compile(r"^(from \w[\w.]* import |import \w|async def |def |class \w+[(:])", re.M)
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:  # the README's example runs as written too
        for match in FENCE.finditer(page.read_text()):
            if match.group(1) != "python":
                assert not looks_like_python.search(match.group(2)), f"{page.name}: python in a {match.group(1)} block"
