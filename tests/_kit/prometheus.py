"""A real Prometheus for the tests: Debian's ``prometheus`` package (the server and ``promtool``).

`binary(name)` finds a tool, skipping the test when it is missing, or failing it under CI
(``.ci/run`` installs the package, as it does Chromium). `Prometheus` runs a server on a
free loopback port over a temporary directory, scraping the given targets every second and
evaluating the given rule files every second; `query`, `alerts` and `rules` read its HTTP API.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from _kit.poll import until
from _kit.ports import free_port

#: The rules and the dashboard users copy (docs/alerts).
ALERTS = Path(__file__).resolve().parents[2] / "docs" / "alerts"


def binary(name: str) -> str:
    """The path of `name` (``prometheus``, ``promtool``): skipped when missing, a failure under CI."""
    found = shutil.which(name)
    if found is None:
        reason = f"{name} is not installed (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must install it (.ci/run does)", pytrace=False)
        pytest.skip(reason)
    return found


def _get(url: str) -> Any:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    with direct.open(url, timeout=5) as resp:
        return json.loads(resp.read())


class Prometheus:
    """One Prometheus server: scrapes `targets` (job ``agentflow``) and evaluates `rule_files`, each every second."""

    def __init__(self, folder: Path, targets: list[str], rule_files: list[Path]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [{"job_name": "agentflow", "static_configs": [{"targets": targets}]}],
        }
        (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = folder / "prometheus.log"
        argv = [
            binary("prometheus"),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address={self.url.removeprefix('http://')}",
            "--log.level=warn",
        ]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    async def ready(self) -> None:
        """Wait until the server answers ``/-/ready``."""

        def answers() -> bool:
            assert self.proc.poll() is None, f"prometheus exited: {self.log.read_text()[-2000:]}"
            try:
                direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                with direct.open(f"{self.url}/-/ready", timeout=1) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False

        await until(answers, "prometheus answering /-/ready", timeout_s=20, every=0.1)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result of an instant query (a vector: each item has ``metric`` and ``value``)."""
        reply = _get(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        assert reply["status"] == "success", reply
        return list(reply["data"]["result"])

    def scalar(self, expr: str) -> float | None:
        """The one value `expr` gives (None when its vector is empty)."""
        found = self.query(expr)
        assert len(found) <= 1, found
        return float(found[0]["value"][1]) if found else None

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now."""
        return list(_get(f"{self.url}/api/v1/alerts")["data"]["alerts"])

    def rules(self) -> list[dict[str, Any]]:
        """Every rule of every group, with its health and last evaluation."""
        groups = _get(f"{self.url}/api/v1/rules")["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def close(self) -> None:
        """Stop the server (its data goes with its temporary directory)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
