"""P0: the engine alone. The 3-node flow of trivial tools with no store, agentflow vs LangGraph.

agentflow: `FlowRunner.run` without a store. LangGraph: the same graph compiled with no
checkpointer, `ainvoke` (async nodes) and `invoke` (sync nodes). The target compares with
the faster of the two LangGraph paths, so it is the stricter reading of P0.
"""

from __future__ import annotations

from bench import _flows
from bench._report import Report, Table, Target
from bench._suite import Context
from bench._timing import Plan, fmt_ratio, fmt_span, interleave

TITLE = "P0: engine, 3-node flow of trivial async tools, no store: agentflow vs LangGraph"
#: P0: agentflow's time per run at most this fraction of LangGraph's.
LIMIT = 0.3


async def run(ctx: Context) -> Report:
    report = Report("engine", TITLE)
    runner = _flows.runner()
    lg_async = _flows.graph().compile()
    lg_sync = _flows.sync_graph().compile()
    order = _flows.ORDER
    cases = {
        "agentflow FlowRunner.run": lambda: runner.run(_flows.flow, order),
        "LangGraph ainvoke": lambda: lg_async.ainvoke(order),
        "LangGraph invoke (sync nodes)": lambda: lg_sync.invoke(order),
    }
    plan = Plan(warmup=ctx.sized(50, 10), blocks=ctx.sized(9, 3), per_block=ctx.sized(200, 30))
    times = await interleave(cases, plan)
    af = times["agentflow FlowRunner.run"]
    table = Table(
        f"Time per run (median of {plan.blocks} blocks of {plan.per_block} runs per case, interleaved; min..max)",
        ["case", "per run", "per superstep", "agentflow / this"],
    )
    for name, series in times.items():
        shown = "" if series is af else fmt_ratio(af.ratio(series))
        table.add(name, fmt_span(series), fmt_span(series / _flows.SUPERSTEPS), shown)
    report.tables.append(table)
    best_name = min(("LangGraph ainvoke", "LangGraph invoke (sync nodes)"), key=lambda n: times[n].median)
    ratio = af.ratio(times[best_name])
    report.targets.append(Target(f"P0 engine vs {best_name}", ratio.median, LIMIT, fmt_ratio(ratio), f"<= {LIMIT}x"))
    report.data = {"plan": plan.__dict__, "per_run_s": times, "ratio_vs_best_langgraph": ratio, "best": best_name}
    return report
