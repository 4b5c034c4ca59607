"""The plot of the recovery benchmark (issues 14 and 51): each kill, and when its run moved again, by kind.

`bench.recovery` re-exports `plot`, which the suite calls after a run (and ``--replot``
from ``bench/results/recovery.json``). Left: each killed run's lease left at the kill
against the time from the kill to the run moving again, by the kind of kill, next to the
line where the dead worker's lease lapses and the target. Right: each kind's times sorted,
with the target marked.
"""

from __future__ import annotations

from pathlib import Path

from bench._report import Report

#: The colour of each kind of kill (`bench.recovery.KINDS`).
COLOURS = {"main": "tab:green", "pool": "tab:purple", "both": "tab:blue", "connect": "tab:orange", "mass": "tab:red"}


def plot(report: Report, out_dir: Path) -> list[Path]:
    """Kill → moving again for every kill of the run (two panels; see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = report.data
    kills = [k for k in data.get("kills", []) if isinstance(k.get("moved_s"), float)]
    if not kills:
        return []
    lease_s = float(data["lease_s"])
    target = lease_s + 10.0
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.4))
    for kind, colour in COLOURS.items():
        mine = [k for k in kills if k.get("kind") == kind]
        if not mine:
            continue
        left.scatter(
            [k["lease_left_s"] for k in mine], [k["moved_s"] for k in mine], s=18, color=colour, label=f"{kind}"
        )
        moved = sorted(k["moved_s"] for k in mine)
        right.step(moved, [(i + 1) / len(moved) for i in range(len(moved))], where="post", color=colour, label=kind)
    edge = [0.0, lease_s]
    left.plot(edge, edge, color="grey", linestyle=":", label="the dead worker's lease lapses")
    left.axhline(target, color="black", linestyle="--", label=f"target: lease_s + 10 s = {target:.0f} s")
    left.set_xlabel("lease left at the kill (s; 0: nobody held the run)")
    left.set_ylabel("kill → the run moving again (s)")
    left.set_xlim(-0.5, lease_s)
    left.set_ylim(0, target + 5)
    left.legend(fontsize=8, loc="center left")
    left.grid(alpha=0.3)
    right.axvline(target, color="black", linestyle="--", label=f"target {target:.0f} s")
    right.set_xlabel("kill → the run moving again (s)")
    right.set_ylabel("share of the kills of a kind")
    right.set_xlim(0, target + 5)
    right.set_ylim(0, 1.02)
    right.legend(fontsize=8, loc="upper left")
    right.grid(alpha=0.3)
    fig.suptitle(f"{len(kills)} runs whose worker process was SIGKILLed, by kind, defaults (lease {lease_s:.0f} s)")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench-recovery.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
