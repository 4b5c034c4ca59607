"""P2: agentflow's Redis durability overhead per one-call superstep vs the floor of the same round trips.

A probe run goes through a Redis client that records every round trip the store makes
(each command, each pipeline) with its arguments. The floor replays exactly those round
trips with redis.asyncio, with the same argument bytes, under keys of its own:

- an EVALSHA of agentflow's scripts becomes an EVALSHA of a trivial script that stores
  the longest argument (the row) under one key: the same request, none of the checks;
- a pipeline is sent again with the same commands aimed at a key of the floor's own;
- any other command becomes an ECHO of the same bytes.

Overhead = (run with the Redis store - run without) / 3 supersteps; floor = one replay of
a run's round trips / 3. All three cases run interleaved.

What the overhead above the floor is made of, measured beside it (issue 17 item 2):

- sealing: the probe run's rows sealed again from their bodies (canonical JSON and HMAC
  of its call records and checkpoints), a fourth case in the same interleaved blocks;
- Lua: the server's time in ``EVALSHA`` per superstep (``INFO commandstats``, its
  ``usec`` counted over runs of the store alone, then of the floor alone), which the
  floor's trivial script takes almost none of;
- the rest is agentflow's client side: the run protocol and journal, the store's row
  encoding, reply checks and per-operation deadline, and the keys the scripts take.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from bench import _flows, _services
from bench._report import Report, Table, Target
from bench._suite import Context
from bench._timing import Plan, Series, fmt_ratio, fmt_span, fmt_time, interleave

TITLE = (
    "P2: Redis durability overhead per one-call superstep vs the floor (same round trips, same bytes, redis.asyncio)"
)
#: P2: overhead at most this multiple of the floor.
LIMIT = 1.3

_FLOOR_LUA = """
local best = ARGV[1] or ''
for i = 2, #ARGV do
  if #ARGV[i] > #best then best = ARGV[i] end
end
redis.call('SET', KEYS[1], best)
return 1
"""


def _recording_factory(url: str, log: list[tuple[str, Any]]) -> Any:
    """A client factory whose clients append every round trip to `log`."""
    import redis.asyncio as aioredis

    class Recording(aioredis.Redis):
        async def execute_command(self, *args: Any, **options: Any) -> Any:
            log.append(("cmd", args))
            # redis-py leaves execute_command unannotated.
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

        def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
            pipe = super().pipeline(transaction, shard_hint)
            execute = pipe.execute

            async def recorded(raise_on_error: bool = True) -> Any:
                log.append(("pipe", [tuple(args) for args, _ in pipe.command_stack]))
                return await execute(raise_on_error)

            pipe.execute = recorded  # type: ignore[method-assign]
            return pipe

    return lambda: Recording.from_url(url)


def _size(args: Any) -> int:
    return sum(len(a) if isinstance(a, bytes | str) else len(str(a)) for a in args)


def _describe(ops: list[tuple[str, Any]]) -> list[str]:
    out = []
    for kind, args in ops:
        if kind == "pipe":
            out.append(f"pipeline[{', '.join(str(c[0]) for c in args)}] {sum(_size(c) for c in args)} B")
        else:
            out.append(f"{args[0]} {_size(args)} B")
    return out


def _resealer(key: bytes, calls: Any, checkpoints: Any) -> Any:
    """Seal a run's rows again from their bodies, as a run seals them (canonical JSON, then HMAC)."""
    import json

    from agentflow.exec.seal import Sealer

    sealer = Sealer(key)
    bodies = [(c.run_id, c.segment, c.seq, c.kind, json.loads(c.payload)) for c in calls]
    states = [(c.run_id, c.step, c.flow, c.status, c.segment, c.saved_at, json.loads(c.payload)) for c in checkpoints]

    def reseal() -> None:
        for args in bodies:
            sealer.seal_call(*args)
        for state in states:
            sealer.seal_checkpoint(*state)

    return reseal


async def _lua_us(client: Any, job: Any, times: int) -> tuple[float, float]:
    """The server's EVALSHA time (µs) and calls per call of `job`, from INFO commandstats before and after."""

    async def evalsha() -> tuple[float, float]:
        stats = (await client.info("commandstats")).get("cmdstat_evalsha", {})
        return float(stats.get("usec", 0)), float(stats.get("calls", 0))

    usec, calls = await evalsha()
    for _ in range(times):
        await job()
    usec_after, calls_after = await evalsha()
    return (usec_after - usec) / times, (calls_after - calls) / times


class Floor:
    """Replays one run's round trips (see the module docstring)."""

    def __init__(self, client: Any, ops: list[tuple[str, Any]], prefix: str) -> None:
        self.client = client
        self.script = client.register_script(_FLOOR_LUA)
        self.key = f"{prefix}:floor:row"
        self.index = f"{prefix}:floor:index"
        self.ops = ops

    async def run(self) -> None:
        for kind, args in self.ops:
            if kind == "pipe":
                pipe = self.client.pipeline(transaction=False)
                for command in args:
                    pipe.execute_command(command[0], self.index, *command[2:])
                await pipe.execute()
            elif str(args[0]).upper() == "EVALSHA":
                numkeys = int(args[2])
                await self.script(keys=[self.key], args=list(args[3 + numkeys :]))
            else:
                await self.client.echo(b"x" * _size(args))


async def run(ctx: Context) -> Report:
    report = Report("redis_floor", TITLE)
    url = ctx.services.redis_url
    if url is None:
        report.notes.append(f"skipped: {ctx.services.redis_why}")
        return report
    flow, order = _flows.flow, _flows.ORDER
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(_services.redis_store(url, ctx.tag))
        runner = _flows.runner(store, ctx.key)
        await runner.run(flow, order)  # loads the scripts
        log: list[tuple[str, Any]] = []
        from agentflow.exec.checkpoints import RedisCheckpointStore

        probe_store = RedisCheckpointStore(_recording_factory(url, log), prefix=ctx.tag, ttl_s=3600)
        stack.push_async_callback(probe_store.aclose)
        probe = _flows.runner(probe_store, ctx.key)
        await probe.run(flow, order)  # first run: loads the scripts on this client
        log.clear()
        probed = await probe.run(flow, order)
        ops = list(log)
        reseal = _resealer(ctx.key, await probe_store.calls(probed.run_id), await probe_store.history(probed.run_id))
        client = _services.redis_factory(url)()  # the store's kind of client
        stack.push_async_callback(client.aclose)
        floor = Floor(client, ops, ctx.tag)
        plain = _flows.runner()
        cases = {
            "agentflow, no store": lambda: plain.run(flow, order),
            "agentflow Redis store": lambda: runner.run(flow, order),
            "floor: the same round trips": floor.run,
            "sealing a run's rows": reseal,
        }
        plan = Plan(warmup=ctx.sized(30, 5), blocks=ctx.sized(9, 3), per_block=ctx.sized(60, 10))
        times = await interleave(cases, plan)
        lua_runs = ctx.sized(300, 30)
        lua = {
            "agentflow Redis store": await _lua_us(client, lambda: runner.run(flow, order), lua_runs),
            "floor: the same round trips": await _lua_us(client, floor.run, lua_runs),
        }
    steps = _flows.SUPERSTEPS
    overhead = (times["agentflow Redis store"] - times["agentflow, no store"]) / steps
    floor_step = times["floor: the same round trips"] / steps
    ratio = overhead.ratio(floor_step)
    table = Table(
        f"Per run and per superstep (median of {plan.blocks} blocks of {plan.per_block} runs, interleaved; min..max)",
        ["case", "per run", "per superstep"],
    )
    for name, series in times.items():
        table.add(name, fmt_span(series), fmt_span(series / steps))
    table.add("agentflow overhead (store - no store)", "", fmt_span(overhead))
    parts = _parts(overhead, floor_step, times["sealing a run's rows"] / steps, lua, steps)
    report.tables.append(parts)
    trips = Table(
        f"Round trips of one run ({len(ops)}: step 0, then {steps} supersteps of one tool call)",
        ["#", "round trip (command, bytes sent)"],
    )
    for i, line in enumerate(_describe(ops), 1):
        trips.add(i, line)
    report.tables[0:0] = [table]
    report.tables.append(trips)
    report.targets.append(Target("P2 Redis overhead / floor", ratio.median, LIMIT, fmt_ratio(ratio), f"<= {LIMIT}x"))
    report.data = {
        "plan": plan.__dict__,
        "per_run_s": times,
        "overhead_per_superstep_s": overhead,
        "floor_per_superstep_s": floor_step,
        "ratio": ratio,
        "round_trips_per_run": len(ops),
        "lua_us_and_evalsha_calls_per_run": lua,
        "round_trips": _describe(ops),
    }
    return report


def _parts(overhead: Series, floor: Series, sealing: Series, lua: dict[str, tuple[float, float]], steps: int) -> Table:
    """What the overhead above the floor is made of, per superstep."""
    ours_us, ours_calls = lua["agentflow Redis store"]
    floor_us, floor_calls = lua["floor: the same round trips"]
    lua_extra = (ours_us - floor_us) / steps * 1e-6
    above = overhead - floor
    table = Table(
        "The overhead above the floor, per superstep (sealing interleaved with the cases above; Lua from INFO "
        "commandstats, EVALSHA usec over runs of each side alone)",
        ["part", "per superstep", "of the overhead above the floor"],
    )
    table.add("overhead above the floor (store - no store - floor)", fmt_span(above), "")
    table.add(
        "sealing (canonical JSON + HMAC of the run's rows)", fmt_span(sealing), f"{sealing.median / above.median:.0%}"
    )
    table.add(
        f"Lua on the server (EVALSHA: {ours_calls:.1f} calls per run, {ours_us / max(ours_calls, 1):.1f} µs each; "
        f"the floor's {floor_us / max(floor_calls, 1):.1f} µs)",
        fmt_time(lua_extra),
        f"{lua_extra / above.median:.0%}",
    )
    rest = above - sealing - lua_extra
    table.add(
        "the rest: the protocol, journal, encoding, checks, deadlines",
        fmt_span(rest),
        f"{rest.median / above.median:.0%}",
    )
    return table
