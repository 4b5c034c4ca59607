"""Issue 20 item 5: supersteps/s as Celery workers are added one at a time, on both deployments, and the costs.

The workload is fixed: R runs of P3's 10-superstep flow (``chain10``, one trivial
idempotent tool per superstep), started at once with `FlowClient.start`; a round's rate is
R x 10 supersteps over the seconds from the first start until every run is done. It goes
through 1, 2, 3 ... worker processes (``celery -A workers worker -P prefork -c 1``, one
more at each level) on two deployments side by side (`bench._scaling_configs`):

- **Redis**: one Redis as broker, result backend and store (the default), a private
  ``redis-server`` so that its counters are ours alone;
- **RabbitMQ + PostgreSQL**: the scale-out configuration of ``docs/scale-out.md``, in a
  virtual host and a database of its own.

At each level both deployments gain a worker, run a warm-up round, then ``rounds`` rounds
each, alternating (the order flipping each round). Around a level's rounds the costs are
read, and divided by the supersteps those rounds made:

- each deployment's worker CPU (main process and pool process, ``/proc``);
- Redis: commands per superstep by name (``INFO commandstats``; this benchmark's own
  looks subtracted) and its main thread's CPU (``INFO cpu``);
- PostgreSQL: transactions per superstep in the database (``pg_stat_database``: the store
  makes one statement per round trip, in autocommit) and its backends' CPU (``/proc``);
- RabbitMQ: the broker's socket reads, writes and bytes on the virtual host's connections
  (``rabbitmqctl list_connections``) and the node's CPU (the whole node: other virtual
  hosts' traffic, if any, is in it).

At the end: bytes stored per run (Redis: ``used_memory`` per run and the run's own keys'
``MEMORY USAGE``; PostgreSQL: the tables' size on disk and their rows' bytes, per run), and,
on RabbitMQ, the messages per superstep, counted by copies in queues bound to the
exchanges for one more round (Redis's are in its command counts: ``LPUSH`` and ``PUBLISH``);
on Redis, one more round under ``MONITOR`` splits the commands and round trips between the
store and Celery. Two floors to compare the costs with, measured in the same run: the
server's CPU for one plain round trip (Redis ``PING``, PostgreSQL ``SELECT 1``), and P3's
bare chained Celery task on one worker of the same Redis (its worker and Redis CPU per task).

Run alone: ``python -m bench --only workers_scaling`` (about 20 minutes here; ``--quick``: 2 levels, 4 runs, 1
round). Needs ``redis-server`` on the path, PostgreSQL and RabbitMQ (``scripts/services.sh``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
from typing import Any

from bench._celery_apps import STEPS
from bench._report import Report
from bench._scaling_configs import RabbitPgConfig, RedisConfig, _Config
from bench._scaling_probes import PG_STATS_IDLE_S, RABBITMQ_URL
from bench._scaling_report import plot, tables
from bench._suite import Context

__all__ = ["TITLE", "plot", "run"]

TITLE = "Issue 20: supersteps/s as -c 1 workers are added one by one, Redis vs RabbitMQ + PostgreSQL, costs per step"


def _rabbit_answers() -> str:
    """Empty when RabbitMQ takes a connection, else why not."""
    from kombu.connection import Connection

    try:
        with Connection(RABBITMQ_URL + "/", connect_timeout=2) as conn:  # type: ignore[no-untyped-call]
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        return f"RabbitMQ at {RABBITMQ_URL} does not answer ({type(exc).__name__})"
    return "" if shutil.which("rabbitmqctl") else "rabbitmqctl is not on the path"


async def _configs(ctx: Context, report: Report) -> list[_Config]:
    configs: list[_Config] = []
    if shutil.which("redis-server"):
        configs.append(RedisConfig(ctx))
    else:
        report.notes.append("Redis skipped: redis-server is not on the path (a private server is started)")
    why = ctx.services.pg_why or await asyncio.to_thread(_rabbit_answers)
    if ctx.services.pg_url is not None and not why:
        configs.append(RabbitPgConfig(ctx, ctx.services.pg_url))
    else:
        report.notes.append(f"RabbitMQ + PostgreSQL skipped: {why}")
    return configs


async def _read(configs: list[_Config], settle_s: float) -> dict[str, dict[str, Any]]:
    """Every counter, PostgreSQL's once its backends have published theirs; CPU and Redis last, just before a round."""
    await asyncio.sleep(settle_s)
    found = {c.key: await c.settled() for c in configs}
    for c in configs:
        found[c.key].update(await c.instant())
    return found


async def _level(configs: list[_Config], runs: int, rounds: int, settle_s: float) -> dict[str, dict[str, Any]]:
    """One more worker on each deployment; their rates over `rounds` rounds and their costs per superstep."""
    for config in configs:
        await config.add_worker()
    for config in configs:  # the new worker's imports and connections
        await config.round(max(2, 2 * config.workers))
    before = await _read(configs, settle_s)
    rates: dict[str, list[float]] = {c.key: [] for c in configs}
    for r in range(rounds):
        for config in configs if r % 2 == 0 else configs[::-1]:
            rates[config.key].append(runs * STEPS / await config.round(runs))
    instant = {c.key: await c.instant() for c in configs}
    await asyncio.sleep(settle_s)
    after = {c.key: {**await c.settled(), **instant[c.key]} for c in configs}
    steps = runs * STEPS * rounds
    return {c.key: {"rates": rates[c.key], **c.costs(before[c.key], after[c.key], steps)} for c in configs}


async def run(ctx: Context) -> Report:
    report = Report("workers_scaling", TITLE)
    configs = await _configs(ctx, report)
    if not configs:
        return report
    runs, rounds, top = ctx.sized(40, 4), ctx.sized(3, 1), ctx.sized(6, 2)
    # PostgreSQL's counts are exact only after its backends publish them; a smoke run does not wait for them.
    settle_s = PG_STATS_IDLE_S if any(isinstance(c, RabbitPgConfig) for c in configs) and not ctx.quick else 0.0
    data: dict[str, Any] = {"runs": runs, "rounds": rounds, "steps": STEPS, "load_at_start": os.getloadavg()}
    data["configs"] = {c.key: {"label": c.label, "levels": {}} for c in configs}
    try:
        for config in configs:
            await config.setup()
        for workers in range(1, top + 1):
            for key, found in (await _level(configs, runs, rounds, settle_s)).items():
                data["configs"][key]["levels"][str(workers)] = {**found, "load": os.getloadavg()[0]}
                print(f"  {key} x{workers}: {statistics.median(found['rates']):.0f} supersteps/s", flush=True)
        for config in configs:
            data["configs"][config.key]["stored"] = await config.stored_per_run()
            data["configs"][config.key]["counted"] = await config.count_round(runs)
            data["configs"][config.key]["floor_us"] = await config.floor_us()
            if isinstance(config, RedisConfig):
                data["configs"][config.key]["bare"] = await config.bare_tasks(runs)
    finally:
        for config in configs:
            await config.close()
    data["load_at_end"] = os.getloadavg()
    report.data = data
    report.tables += tables(data)
    loads = ["/".join(f"{x:.1f}" for x in data[k]) for k in ("load_at_start", "load_at_end")]
    report.notes.append(
        f"load average (1/5/15 min) at the start {loads[0]}, at the end {loads[1]} ({os.cpu_count()} cores)"
    )
    if ctx.quick:
        report.notes.append(
            "quick: PostgreSQL's transaction counts were read without waiting for its backends to publish them"
        )
    return report
