"""A real three-node Redis Cluster for one test (``redis_cluster`` fixture: the nodes' ports).

Started from the machine's ``redis-server`` on free loopback ports, keeping nothing on disk,
and stopped afterwards; skipped when ``redis-server`` or ``redis-cli`` is missing.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from _kit.ports import free_port


def _ask(port: int, command: str) -> Any:
    with redis.Redis(port=port, socket_connect_timeout=1) as client:
        return client.execute_command(command)


def _cluster_ok(port: int) -> bool:
    info = _ask(port, "CLUSTER INFO")  # parsed to a dict by redis-py
    return isinstance(info, dict) and info.get("cluster_state") in ("ok", b"ok")


def _wait(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[list[int]]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server and redis-cli must be on PATH for the Redis Cluster test")
    ports = [free_port(also_free_at=10000) for _ in range(3)]  # a node's bus is at its port + 10000
    procs = []
    for port in ports:
        args = ["--port", str(port), "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
        args += ["--save", "", "--appendonly", "no", "--bind", "127.0.0.1", "--daemonize", "no", "--dir", str(tmp_path)]
        procs.append(subprocess.Popen(["redis-server", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        for port in ports:
            _wait(partial(_ask, port, "PING"), f"redis-server on port {port}")
        nodes = [f"127.0.0.1:{p}" for p in ports]
        cmd = ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)
        for port in ports:
            _wait(partial(_cluster_ok, port), "cluster_state:ok")
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)
