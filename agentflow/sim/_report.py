"""What a simulation prints: steps, speed, runs and their ends, faults by kind, which points they hit, which deploys."""

from __future__ import annotations

from collections import defaultdict

from agentflow.sim._deploys import CHANGES, KINDS
from agentflow.sim._simulation import Report


def describe(report: Report) -> str:
    """A plain-text report of one set-up's simulation."""
    stats = report.stats
    rate = stats.steps / report.seconds if report.seconds else 0.0
    ends = ", ".join(f"{n} {status}" for status, n in sorted(report.ends.items()))
    faults = ", ".join(f"{kind} {n}" for kind, n in sorted(stats.faults.items())) or "none"
    hit: dict[str, set[str]] = defaultdict(set)
    for kind, point in stats.covered:
        hit[kind].add(point)
    lines = [
        f"== {report.setup}: seed {report.seed}: {stats.steps:,} steps in {report.seconds:.1f} s ({rate:,.0f} steps/s)",
        f"   {report.episodes} episodes, {report.runs} runs ({ends}), {report.effects} tool effects",
        f"   claims: {', '.join(f'{cause} {n}' for cause, n in sorted(report.claims.items())) or 'none'}",
        f"   faults: {faults}",
    ]
    lines.append(f"   points: {len(stats.points)} kinds of point where a task parked")
    for kind in ("crash", "stall"):
        missed = sorted(stats.points - hit.get(kind, set()))
        lines.append(f"   {kind} hit {len(hit.get(kind, ()))} of them; never: {', '.join(missed) or 'none'}")
    store_ops = {p for p in stats.points if p.startswith("store.") and not p.endswith(".returned")}
    for kind in ("store-fails-before", "store-fails-after"):
        missed = sorted(store_ops - hit.get(kind, set()))
        count = len(hit.get(kind, ()))
        lines.append(f"   {kind} hit {count} of {len(store_ops)} operations; never: {', '.join(missed) or 'none'}")
    made = {point for kind, point in stats.covered if kind in KINDS}
    unmade = ", ".join(c for c in CHANGES if c not in made) or "none"
    lines.append(f"   deploys made {len(made)} of the {len(CHANGES)} changes a deploy can make; never: {unmade}")
    lines.append("   invariants: " + ("held" if report.failure is None else "BROKEN"))
    if report.failure is not None:
        lines.append(str(report.failure))
    return "\n".join(lines)
