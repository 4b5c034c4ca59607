"""The tables and the plot of `bench.workers_scaling`, from its raw figures (``report.data``).

Costs per superstep are shown level by level and, for the capacity model of
``docs/scaling.md``, as the median over the levels. Redis's time in commands is
``INFO commandstats``'s ``usec`` (a script's time includes the commands it runs, which
are counted again under their own names); it is given per owner by pricing each owner's
commands, counted with ``MONITOR``, at the average time of a call of that name.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from bench._report import Report, Table


def rate(found: dict[str, Any]) -> float:
    """The median supersteps/s of one level."""
    return float(statistics.median(found["rates"]))


def median_over_levels(levels: dict[str, Any], key: str) -> float:
    return float(statistics.median(found[key] for found in levels.values()))


def exec_us_by_owner(found: dict[str, Any]) -> dict[str, float]:
    """Redis's time in commands per superstep, store's and Celery's: each owner's commands at the average price."""
    levels = found["levels"].values()
    calls = {n: sum(f["commands"].get(n, 0.0) for f in levels) for f in levels for n in f["commands"]}
    usec = {n: sum(f["command_us"].get(n, 0.0) for f in levels) for n in calls}
    price = {n: usec[n] / calls[n] for n in calls if calls[n]}
    counted = found["counted"]
    return {
        owner: sum(n * price.get(name, 0.0) for name, n in counted[owner]["by_name"].items())
        for owner in ("store", "celery")
    }


def cpu_by_owner(found: dict[str, Any]) -> dict[str, float]:
    """Redis's main-thread CPU per superstep split between the store and Celery (an estimate).

    The model: the thread's CPU is a price per round trip (reading a request, writing its
    reply) times the round trips, plus the time in commands. The price is what is left of
    the measured CPU after the commands' time, over the round trips counted; each owner then
    gets its round trips at that price plus its commands' time.
    """
    counted, exec_us = found["counted"], exec_us_by_owner(found)
    trips = {owner: counted[owner]["round_trips"] for owner in ("store", "celery")}
    total = median_over_levels(found["levels"], "redis_cpu_us")
    price = max(0.0, total - sum(exec_us.values())) / sum(trips.values())
    return {"per_round_trip": price, **{owner: trips[owner] * price + exec_us[owner] for owner in trips}}


def cpu_per_step_ms(key: str, found: dict[str, Any]) -> float:
    """All the CPU one superstep costs (ms; medians over the levels): workers, client and the deployment's servers."""
    levels = found["levels"]
    servers = ("redis_cpu_us",) if key == "redis" else ("pg_cpu_us", "rabbit_cpu_us")
    own = median_over_levels(levels, "worker_cpu_ms") + median_over_levels(levels, "client_cpu_ms")
    return own + sum(median_over_levels(levels, k) for k in servers) / 1e3


def _ceiling_table(data: dict[str, Any]) -> Table:
    cores = os.cpu_count() or 1
    table = Table(
        f"The model against the curve: {cores} cores alone, divided by all the CPU a superstep costs",
        ["deployment", "CPU per superstep (ms)", f"{cores} cores alone would allow", "best measured", "of it"],
    )
    for key, found in data["configs"].items():
        cpu, best = cpu_per_step_ms(key, found), max(rate(f) for f in found["levels"].values())
        table.add(
            found["label"],
            f"{cpu:.1f}",
            f"{1e3 * cores / cpu:.0f}/s",
            f"{best:.0f}/s",
            f"{best * cpu / 1e3 / cores:.2f}",
        )
    return table


def _rates_table(data: dict[str, Any]) -> Table:
    configs = data["configs"]
    keys = list(configs)
    table = Table(
        f"Supersteps/s against workers: {data['runs']} runs x {data['steps']} supersteps started at once, "
        f"median of {data['rounds']} rounds (min..max); vs linear = rate / (workers x the 1-worker rate)",
        ["workers"]
        + [f"{configs[k]['label']}: {col}" for k in keys for col in ("supersteps/s", "vs linear")]
        + ["load (1 min)"],
    )
    for level in configs[keys[0]]["levels"]:
        row = [level]
        for key in keys:
            levels = configs[key]["levels"]
            found, one = levels[level], rate(levels["1"])
            row += [f"{rate(found):.0f} ({min(found['rates']):.0f}..{max(found['rates']):.0f})"]
            row += [f"{rate(found) / (int(level) * one):.2f}"]
        table.add(*row, f"{configs[keys[0]]['levels'][level].get('load', float('nan')):.1f}")
    return table


def _redis_tables(found: dict[str, Any]) -> list[Table]:
    levels = found["levels"]
    by_level = Table(
        "Redis: costs per superstep, by workers (commands: INFO commandstats, those its scripts run included)",
        ["workers", "worker CPU (ms)", "client CPU (ms)", "Redis commands", "Redis main thread CPU (µs)"],
    )
    keys = ("worker_cpu_ms", "client_cpu_ms", "redis_commands", "redis_cpu_us")
    for level, f in [*levels.items(), ("median", {k: median_over_levels(levels, k) for k in keys})]:
        by_level.add(
            level,
            f"{f['worker_cpu_ms']:.2f}",
            f"{f['client_cpu_ms']:.2f}",
            f"{f['redis_commands']:.1f}",
            f"{f['redis_cpu_us']:.0f}",
        )
    counted, exec_us, cpu = found["counted"], exec_us_by_owner(found), cpu_by_owner(found)
    owners = Table(
        "Redis per superstep by owner, one round with MONITOR on (a client's commands sent together count as one "
        "round trip; time in commands: commandstats usec at each command's average; main thread CPU: the median "
        f"above split as {cpu['per_round_trip']:.0f} µs per round trip plus the time in commands)",
        ["owner", "commands sent", "round trips", "time in commands (µs)", "main thread CPU (µs, est.)"]
        + ["commands (per superstep)"],
    )
    for owner, label in (("store", "the checkpoint store"), ("celery", "Celery: broker, results, events")):
        part = counted[owner]
        names = ", ".join(f"{n.upper()} {v:.2f}" for n, v in part["by_name"].items() if v >= 0.05)
        row = [f"{part['sent']:.2f}", f"{part['round_trips']:.2f}", f"{exec_us[owner]:.0f}", f"{cpu[owner]:.0f}"]
        owners.add(label, *row, names)
    inner = ", ".join(f"{n.upper()} {v:.2f}" for n, v in sorted(counted["lua"].items(), key=lambda kv: -kv[1]))
    owners.add("inside the store's scripts", f"{sum(counted['lua'].values()):.2f}", "-", "(in EVALSHA's)", "-", inner)
    return [by_level, owners]


def _rabbit_pg_table(levels: dict[str, Any]) -> Table:
    table = Table(
        "RabbitMQ + PostgreSQL: costs per superstep, by workers (PG: the store's database; RabbitMQ: the vhost's "
        "connections, the node's CPU)",
        ["workers", "worker CPU (ms)", "client CPU (ms)", "PG transactions", "PG backends CPU (µs)"]
        + ["RabbitMQ socket reads / writes", "RabbitMQ bytes", "RabbitMQ node CPU (µs)"],
    )
    rows = [(level, f) for level, f in levels.items()]
    keys = ("worker_cpu_ms", "client_cpu_ms", "pg_xacts", "pg_cpu_us", "rabbit_reads", "rabbit_writes")
    rows.append(("median", {k: median_over_levels(levels, k) for k in (*keys, "rabbit_bytes", "rabbit_cpu_us")}))
    for level, f in rows:
        table.add(
            level,
            f"{f['worker_cpu_ms']:.2f}",
            f"{f['client_cpu_ms']:.2f}",
            f"{f['pg_xacts']:.2f}",
            f"{f['pg_cpu_us']:.0f}",
            f"{f['rabbit_reads']:.1f} / {f['rabbit_writes']:.1f}",
            f"{f['rabbit_bytes']:.0f}",
            f"{f['rabbit_cpu_us']:.0f}",
        )
    return table


def _stored_table(configs: dict[str, Any]) -> Table:
    table = Table(
        "Bytes stored per run, broker messages per superstep, and a plain round trip's server CPU (one client)",
        ["deployment", "measured", "value"],
    )
    if "redis" in configs:
        stored, one = configs["redis"]["stored"], configs["redis"]["levels"]["1"]["commands"]
        memory = median_over_levels(configs["redis"]["levels"], "memory_per_run")
        table.add("Redis", "used_memory per run (store, results, queues; median over the levels)", f"{memory:.0f} B")
        table.add("Redis", "the run's own keys (MEMORY USAGE)", f"{stored['store_keys_per_run']:.0f} B")
        pushes = f"{one.get('lpush', 0):.2f} / {one.get('publish', 0):.2f}"
        table.add("Redis", "LPUSH (task messages) / PUBLISH (events, results)", pushes)
        table.add("Redis", "main thread CPU per PING round trip", f"{configs['redis']['floor_us']:.1f} µs")
        bare = configs["redis"].get("bare")
        if bare:
            cpu = f"{bare['worker_cpu_ms']:.2f} ms / {bare['redis_cpu_us']:.0f} µs"
            table.add("Redis", "a bare chained Celery task (P3's other side): worker CPU / Redis CPU", cpu)
    if "rabbit_pg" in configs:
        stored, sent = configs["rabbit_pg"]["stored"], configs["rabbit_pg"]["counted"]
        table.add("PostgreSQL", "tables on disk per run (with indexes)", f"{stored['disk_per_run']:.0f} B")
        table.add("PostgreSQL", "rows' bytes per run", f"{stored['row_bytes_per_run']:.0f} B")
        table.add("PostgreSQL", "backend CPU per SELECT 1 round trip", f"{configs['rabbit_pg']['floor_us']:.1f} µs")
        msgs = f"{sent['task_messages']:.2f} / {sent['event_messages']:.2f}"
        table.add("RabbitMQ", "task messages / task events (copies in queues of ours)", msgs)
    return table


def tables(data: dict[str, Any]) -> list[Table]:
    configs = data["configs"]
    out = [_rates_table(data), _ceiling_table(data)]
    if "redis" in configs:
        out += _redis_tables(configs["redis"])
    if "rabbit_pg" in configs:
        out.append(_rabbit_pg_table(configs["rabbit_pg"]["levels"]))
    out.append(_stored_table(configs))
    return out


def plot(report: Report, out_dir: Path) -> list[Path]:
    """Supersteps/s against workers for both deployments, with linear scaling from one worker; and the ratio to it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = report.data.get("configs") or {}
    if not configs:
        return []
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 7), sharex=True, height_ratios=[2, 1])
    for (key, found), color in zip(configs.items(), ("tab:red", "tab:blue"), strict=False):
        levels = found["levels"]
        x = [int(k) for k in levels]
        med = [rate(f) for f in levels.values()]
        low = [m - min(f["rates"]) for m, f in zip(med, levels.values(), strict=True)]
        high = [max(f["rates"]) - m for m, f in zip(med, levels.values(), strict=True)]
        top.errorbar(x, med, yerr=[low, high], marker="o", capsize=3, color=color, label=found["label"])
        top.plot(x, [med[0] * n for n in x], linestyle="--", color=color, alpha=0.4, label="linear from 1 worker")
        ceiling = 1e3 * (os.cpu_count() or 1) / cpu_per_step_ms(key, found)
        top.axhline(
            ceiling, linestyle=":", color=color, alpha=0.7, label=f"{os.cpu_count()} cores alone: {ceiling:.0f}/s"
        )
        bottom.plot(x, [m / (n * med[0]) for m, n in zip(med, x, strict=True)], marker="o", color=color)
    top.set_ylabel("supersteps/s (median, min..max)")
    top.set_ylim(bottom=0)
    top.set_title(
        f"{report.data['runs']} runs x {report.data['steps']} supersteps, prefork -c 1 workers, "
        f"{os.cpu_count()} cores shared",
        fontsize=10,
    )
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    bottom.set_ylabel("of linear scaling")
    bottom.set_xlabel("worker processes")
    bottom.set_ylim(0, max(1.1, bottom.get_ylim()[1]))
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench-workers-scaling.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
