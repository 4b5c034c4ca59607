"""P5: bytes a durable tool loop writes per stage as the history grows, and vs LangGraph's SqliteSaver.

The conversation is scripted (`ScriptedModel`), the same for both: one user message, then
turns of an assistant message asking for one tool call and the tool's result, then a final
answer. Message sizes are fixed (user 200 characters, assistant 80 plus its call, tool
result 400, answer 300), so every stage adds the same amount of new content.

agentflow: `run_tool_loop` on an `SQLiteCheckpointStore`. A stage is one checkpoint
(``model``: after a reply; ``tools``: after the tool results) with the call records
written since the previous one (the model-call marker; the tool's ``started`` and
``done``). Bytes are counted from the store's own tables: ``length(payload)`` (and the whole
row: payload, signature, key id, run id).

LangGraph: a `StateGraph` over ``messages`` with `add_messages`, a model node and a tool
node (one checkpoint per stage), `SqliteSaver`; bytes are ``length(checkpoint) +
length(metadata)`` of its checkpoints plus ``length(value)`` of its writes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from agentflow import Registry
from agentflow.exec import run_tool_loop
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.models import Message, ScriptedModel, ToolCall
from bench._report import Report, Table, Target
from bench._suite import Context

TITLE = "P5: tool-loop storage, bytes per stage vs history length, and a 200-message conversation vs LangGraph"
#: P5: LangGraph's bytes at least this multiple of agentflow's for the 200-message conversation.
FACTOR = 10.0
#: Messages in the comparison conversation (1 user + 99 turns of 2 + the answer).
COMPARED = 200


def _text(seed: str, size: int) -> str:
    words = (seed + " lorem ipsum dolor sit amet consectetur adipiscing elit ").split()
    out = ""
    i = 0
    while len(out) < size:
        out += words[i % len(words)] + " "
        i += 1
    return out[:size]


def _tool_result(query: str) -> str:
    return _text(f"result for {query}", 400)


def conversation(turns: int) -> tuple[list[Message], list[Message]]:
    """(initial messages, the model's replies): `turns` tool-call turns, then an answer."""
    initial = [Message.user(_text("please look into the order history", 200))]
    replies = [
        Message.assistant(
            _text(f"step {t}: I will look this up", 80),
            [ToolCall(id=f"call_{t}", name="lookup", arguments={"query": f"order {t} status"})],
        )
        for t in range(turns)
    ]
    replies.append(Message.assistant(_text("here is the summary of everything", 300)))
    return initial, replies


def _registry() -> Registry:
    registry = Registry()

    @registry.tool(idempotent=True)
    async def lookup(query: str) -> str:
        """Look something up."""
        return _tool_result(query)

    return registry


async def agentflow_stages(path: Path, key: bytes, turns: int) -> tuple[list[dict[str, Any]], int]:
    """Run the loop; return one entry per stage (step, history length, bytes) and the message count."""
    initial, replies = conversation(turns)
    async with SQLiteCheckpointStore(path, synchronous="NORMAL") as store:
        result = await run_tool_loop(
            ScriptedModel(replies), _registry(), initial, checkpoints=store, checkpoint_key=key, max_steps=turns + 1
        )
    assert result.status == "done", result
    with sqlite3.connect(path) as db:
        cps = db.execute(
            "SELECT step, json_extract(payload, '$.history.len'), json_extract(payload, '$.stage'), length(payload), "
            "length(payload) + length(sig) + length(kid) + length(run_id) + length(flow) + length(status) "
            "FROM checkpoints WHERE run_id = ? ORDER BY step",
            (result.run_id,),
        ).fetchall()
        calls = db.execute(
            "SELECT json_extract(payload, '$.superstep'), json_extract(payload, '$.model'), length(payload), "
            "length(payload) + length(sig) + length(kid) + length(run_id) + length(kind) "
            "FROM calls WHERE run_id = ? ORDER BY segment, seq",
            (result.run_id,),
        ).fetchall()
    return _attribute(cps, calls), len(result.messages)


def _attribute(cps: list[tuple[Any, ...]], calls: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Give each stage its checkpoint and the call records written just before it.

    The model marker of turn t (superstep t, ``model``) precedes the ``model`` checkpoint of
    turn t; the tool records of turn t (superstep t) precede its ``tools`` checkpoint.
    """
    stages = []
    turn = 0
    for step, hlen, stage, payload, row in cps:
        entry = {"step": step, "history": hlen, "stage": stage, "payload": payload, "row": row}
        if stage == "model":
            turn += 1
            mine = [c for c in calls if c[0] == turn and c[1]]
        elif stage == "tools":
            mine = [c for c in calls if c[0] == turn and not c[1]]
        else:
            mine = []
        entry["payload"] += sum(c[2] for c in mine)
        entry["row"] += sum(c[3] for c in mine)
        entry["records"] = len(mine)
        stages.append(entry)
    return stages


def langgraph_bytes(path: Path, turns: int) -> tuple[int, int, int, int]:
    """Run the same conversation through LangGraph + SqliteSaver; return (bytes, checkpoints, writes, file bytes)."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    from bench._langgraph import sqlite_saver

    initial, replies = conversation(turns)
    script = iter(replies)

    def model(state: MessagesState) -> dict[str, Any]:
        reply = next(script)
        calls = [{"id": c.id, "name": c.name, "args": c.arguments} for c in reply.tool_calls]
        return {"messages": [AIMessage(content=reply.content, tool_calls=calls)]}

    def tools(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage), last  # the model node's reply
        return {
            "messages": [
                ToolMessage(content=_tool_result(c["args"]["query"]), tool_call_id=c["id"], name=c["name"])
                for c in last.tool_calls
            ]
        }

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    graph.add_edge("tools", "model")
    saver, conn = sqlite_saver(path, "NORMAL")
    try:
        out = graph.compile(checkpointer=saver).invoke(
            {"messages": [HumanMessage(content=initial[0].content)]},
            {"configurable": {"thread_id": "conversation"}, "recursion_limit": 4 * turns + 10},
        )
        assert len(out["messages"]) == 2 * turns + 2, len(out["messages"])
        cp_bytes, cps = conn.execute(
            "SELECT sum(length(checkpoint) + length(metadata)), count(*) FROM checkpoints"
        ).fetchone()
        w_bytes, writes = conn.execute("SELECT coalesce(sum(length(value)), 0), count(*) FROM writes").fetchone()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    finally:
        conn.close()
    return cp_bytes + w_bytes, cps, writes, pages * page_size


def _file_bytes(path: Path) -> int:
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages: int = db.execute("PRAGMA page_count").fetchone()[0]
        page_size: int = db.execute("PRAGMA page_size").fetchone()[0]
        return pages * page_size


async def run(ctx: Context) -> Report:
    report = Report("loop_storage", TITLE)
    lengths = [10, 100] if ctx.quick else [10, 100, 1000]
    turns = max(lengths) // 2
    stages, total = await agentflow_stages(ctx.tmp / "long.db", ctx.key, turns)
    by_len = {s["history"]: s for s in stages}
    growth = Table(
        f"agentflow bytes written per stage as the history grows (one run of {total} messages, "
        "SQLite store; payload = canonical JSON of checkpoint + call records; row = payload + signature, key id, ids)",
        ["history (messages)", "model stage: payload / row", "tools stage: payload / row", "per stage (mean) payload"],
    )
    per_stage: dict[int, float] = {}
    for n in lengths:
        model, tools = by_len[n], by_len[n + 1]
        per_stage[n] = (model["payload"] + tools["payload"]) / 2
        growth.add(
            n,
            f"{model['payload']:,} / {model['row']:,} B",
            f"{tools['payload']:,} / {tools['row']:,} B",
            f"{per_stage[n]:,.0f} B",
        )
    report.tables.append(growth)
    flat = per_stage[lengths[-1]] / per_stage[lengths[0]]
    report.targets.append(
        Target(
            f"P5 per-stage bytes at {lengths[-1]} / at {lengths[0]} messages",
            flat,
            1.1,
            f"{flat:.3f}x",
            "flat (<= 1.1x)",
        )
    )

    cmp_turns = (COMPARED - 2) // 2
    ours, count = await agentflow_stages(ctx.tmp / "compared.db", ctx.key, cmp_turns)
    ours_payload, ours_rows = sum(s["payload"] for s in ours), sum(s["row"] for s in ours)
    ours_file = _file_bytes(ctx.tmp / "compared.db")
    theirs, cps, writes, theirs_file = langgraph_bytes(ctx.tmp / "langgraph.db", cmp_turns)
    cmp = Table(
        f"A {count}-message conversation ({cmp_turns} tool turns), total bytes stored",
        ["", "agentflow (SQLite store)", "LangGraph (SqliteSaver)", "LangGraph / agentflow"],
    )
    cmp.add(
        "rows",
        f"{len(ours)} checkpoints + {sum(s['records'] for s in ours)} call records",
        f"{cps} checkpoints + {writes} writes",
        "",
    )
    cmp.add(
        "payload bytes",
        f"{ours_payload:,}",
        f"{theirs:,} (checkpoint + metadata + writes)",
        f"{theirs / ours_payload:.1f}x",
    )
    cmp.add(
        "row bytes (agentflow with signatures and ids)", f"{ours_rows:,}", f"{theirs:,}", f"{theirs / ours_rows:.1f}x"
    )
    cmp.add(
        "database file after a WAL checkpoint", f"{ours_file:,}", f"{theirs_file:,}", f"{theirs_file / ours_file:.1f}x"
    )
    report.tables.append(cmp)
    factor = theirs / ours_rows
    report.targets.append(
        Target(
            f"P5 {count}-message conversation: LangGraph bytes / agentflow bytes",
            factor,
            FACTOR,
            f"{factor:.1f}x",
            f">= {FACTOR:.0f}x",
            at_least=True,
        )
    )
    report.data = {
        "lengths": lengths,
        "per_stage_payload_bytes": per_stage,
        "stages": stages,
        "compared": {
            "messages": count,
            "agentflow_payload": ours_payload,
            "agentflow_rows": ours_rows,
            "agentflow_file": ours_file,
            "langgraph": theirs,
            "langgraph_file": theirs_file,
            "langgraph_checkpoints": cps,
            "langgraph_writes": writes,
        },
    }
    return report


def plot(report: Report, out_dir: Path) -> list[Path]:
    """Bytes written per stage against the history length (agentflow), with the LangGraph total beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [s for s in report.data["stages"] if s["stage"] in ("model", "tools")]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.3), gridspec_kw={"width_ratios": [2.2, 1]})
    for stage, color in (("model", "#1f77b4"), ("tools", "#2ca02c")):
        pts = [(s["history"], s["payload"]) for s in stages if s["stage"] == stage]
        ax.plot(*zip(*pts, strict=True), ".", ms=3, color=color, label=f"{stage} stage")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("messages in the history")
    ax.set_ylabel("bytes written in the stage (checkpoint + call records)")
    ax.set_title("agentflow: bytes per tool-loop stage stay flat")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    c = report.data["compared"]
    bars = [c["agentflow_rows"], c["langgraph"]]
    bx.bar(["agentflow", "LangGraph\nSqliteSaver"], [b / 1e6 for b in bars], color=["#1f77b4", "#ff7f0e"])
    for i, b in enumerate(bars):
        bx.text(i, b / 1e6, f"{b / 1e6:.2f} MB", ha="center", va="bottom", fontsize=9)
    bx.set_ylabel("MB stored")
    bx.set_title(f"{c['messages']}-message conversation, total")
    bx.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench-loop-bytes.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [path]
