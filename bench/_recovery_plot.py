"""The plot of the recovery benchmark (issue 14, P7): each kill, and when its run moved again.

`bench.recovery` re-exports `plot`, which the suite calls after a run (and ``--replot``
from ``bench/results/recovery.json``). Left: each killed run's lease left at the kill
against the time from the kill to the run moving again, by what moved it, next to the
line where the dead worker's lease lapses and the target. Right: the same times sorted,
with p50, p95 and the target marked.
"""

from __future__ import annotations

from pathlib import Path

from bench._report import Report


def plot(report: Report, out_dir: Path) -> list[Path]:
    """Kill → moving again for every kill of the run (two panels; see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = report.data
    kills = [k for k in data.get("kills", []) if k.get("moved_s") is not None]
    if not kills:
        return []
    lease_s = float(data["lease_s"])
    target = lease_s + 5.0
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.4))
    for cause, colour in (("recheck", "tab:blue"), ("recover", "tab:orange")):
        mine = [k for k in kills if k.get("cause") == cause]
        if mine:
            left.scatter(
                [k["lease_left_s"] for k in mine],
                [k["moved_s"] for k in mine],
                s=18,
                color=colour,
                label=f"moved by a {cause} ({len(mine)})",
            )
    others = [k for k in kills if k.get("cause") not in ("recheck", "recover")]
    if others:
        left.scatter([k["lease_left_s"] for k in others], [k["moved_s"] for k in others], s=18, color="grey")
    edge = [0.0, lease_s]
    left.plot(edge, edge, color="grey", linestyle=":", label="the dead worker's lease lapses")
    left.axhline(target, color="tab:red", linestyle="--", label=f"target: lease_s + 5 s = {target:.0f} s")
    left.set_xlabel("lease left at the kill (s)")
    left.set_ylabel("kill → the run moving again (s)")
    left.set_xlim(0, lease_s)
    left.set_ylim(0, target + 5)
    left.legend(fontsize=8, loc="upper left")
    left.grid(alpha=0.3)
    moved = sorted(k["moved_s"] for k in kills)
    ranks = [(i + 1) / len(moved) for i in range(len(moved))]
    right.step(moved, ranks, where="post", color="tab:blue")
    stats = data.get("moved_s", {})
    for name, style in (("p50", ":"), ("p95", "-.")):
        if name in stats:
            right.axvline(stats[name], color="grey", linestyle=style, label=f"{name} {stats[name]:.1f} s")
    right.axvline(target, color="tab:red", linestyle="--", label=f"target {target:.0f} s")
    right.set_xlabel("kill → the run moving again (s)")
    right.set_ylabel("share of the kills")
    right.set_xlim(0, target + 5)
    right.set_ylim(0, 1.02)
    right.legend(fontsize=8, loc="upper left")
    right.grid(alpha=0.3)
    again = int(data.get("second_wave", 0))
    also = f", then {again} of their fresh workers killed in start-up" if again else ""
    fig.suptitle(f"{len(kills)} SIGKILLs inside a tool call{also}, default settings (lease {lease_s:.0f} s)")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench-recovery.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
