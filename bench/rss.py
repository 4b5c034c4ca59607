"""Issue 8 item 4: one worker process running 1,000 runs one after another keeps a flat RSS.

A fresh child process (``python -m bench.rss --child DB RUNS``) runs the 3-node flow on an
`SQLiteCheckpointStore`, one run after another, and samples its resident set size
(``VmRSS`` in /proc/self/status) after run 1, 10, 50, then every 50 runs, and its peak
(``VmHWM``) at the end. A fresh process keeps the other benchmarks' memory out of it.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
from pathlib import Path

from bench._report import Report, Table, Target
from bench._suite import Context

TITLE = "Memory: RSS of one process running 1,000 runs one after another (SQLite store)"
#: Flat: RSS grows by at most this many bytes per run between run `FROM` and the last run.
LIMIT_BYTES_PER_RUN = 1024
#: Where the flatness is judged from: SQLite's page cache (``cache_size``, 2 MiB by default)
#: fills while the database grows over the first few hundred runs, and then stops growing.
FROM = 500
SHOWN = (1, 10, 100, 500, 1000)


def _status(field: str) -> int:
    """A size from /proc/self/status in bytes (``VmRSS``: resident now; ``VmHWM``: the peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def _rss() -> int:
    return _status("VmRSS")


async def _child(db: Path, runs: int) -> dict[str, object]:
    import secrets

    from agentflow.exec.checkpoints import SQLiteCheckpointStore
    from bench import _flows

    samples: dict[int, int] = {0: _rss()}
    async with SQLiteCheckpointStore(db) as store:
        runner = _flows.runner(store, secrets.token_bytes(32))
        for i in range(1, runs + 1):
            result = await runner.run(_flows.flow, _flows.ORDER)
            assert result.status == "done"
            if i in (1, 10) or i % 50 == 0 or i == runs:
                samples[i] = _rss()
    # VmHWM can lag behind the sampled VmRSS (the kernel syncs its counters lazily): keep the larger.
    peak = max(_status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, *samples.values())
    return {"samples": samples, "peak": peak}


async def run(ctx: Context) -> Report:
    report = Report("rss", TITLE)
    runs = ctx.sized(1000, 600)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.rss",
        "--child",
        str(ctx.tmp / "rss.db"),
        str(runs),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the child process failed:\n{err.decode()}")
    found = json.loads(out)
    samples = {int(k): v for k, v in found["samples"].items()}
    table = Table(
        f"RSS of a fresh process after n runs (peak over the whole process: {found['peak'] / 2**20:.1f} MiB)",
        ["after run", "RSS", "change since run 100", f"change since run {FROM}"],
    )
    for n in [n for n in SHOWN if n in samples] + ([runs] if runs not in SHOWN else []):
        since = [f"{(samples[n] - samples[k]) / 2**20:+.2f} MiB" if n >= k else "" for k in (100, FROM)]
        table.add(n, f"{samples[n] / 2**20:.1f} MiB", *since)
    table.note = (
        f"RSS grows by {(samples[FROM] - samples[100]) / 2**20:.2f} MiB from run 100 to run {FROM}, then stops: "
        "consistent with SQLite's page cache (cache_size, 2 MiB by default) filling while the database grows."
    )
    report.tables.append(table)
    per_run = (samples[runs] - samples[FROM]) / (runs - FROM)
    report.targets.append(
        Target(
            f"RSS growth per run, run {FROM} -> {runs}",
            per_run,
            LIMIT_BYTES_PER_RUN,
            f"{per_run:+.0f} B/run ({(samples[runs] - samples[FROM]) / 2**20:+.2f} MiB)",
            f"<= {LIMIT_BYTES_PER_RUN} B/run (flat)",
        )
    )
    report.data = {"runs": runs, "rss_bytes": samples, "peak_bytes": found["peak"], "growth_bytes_per_run": per_run}
    return report


def plot(report: Report, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = {int(k): v for k, v in report.data["rss_bytes"].items()}
    xs = sorted(samples)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(xs, [samples[x] / 2**20 for x in xs], marker=".", color="#1f77b4")
    ax.set_ylim(0, max(samples.values()) / 2**20 * 1.2)
    ax.set_xlabel("runs completed (one after another, same process)")
    ax.set_ylabel("RSS, MiB")
    ax.set_title(f"RSS of one worker process over {report.data['runs']:,} runs (SQLite store)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench-rss.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [path]


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    print(json.dumps(asyncio.run(_child(Path(sys.argv[2]), int(sys.argv[3])))))
