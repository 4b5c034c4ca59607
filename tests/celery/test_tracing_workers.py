"""One trace per run across real prefork workers, a SIGKILL between them: each worker exports its spans with the SDK."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _kit.poll import until
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentflow.observe import Tracing

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]


def exported(folder: Path, run_id: str) -> list[dict[str, Any]]:
    """The spans of `run_id` the pool processes of one worker wrote so far (complete lines only), in order."""
    spans = []
    for path in sorted(folder.glob("spans-*.jsonl")):
        for line in path.read_text().split("\n")[:-1]:
            span = json.loads(line)
            if span["attributes"].get("agentflow.run_id") == run_id:
                spans.append(span)
    return sorted(spans, key=lambda s: s["start_time"])


def named(spans: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"].startswith(prefix)]


def calls(spans: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(tool, outcome) of each tool call span, in order."""
    return [
        (s["attributes"]["agentflow.tool"], s["attributes"]["agentflow.outcome"])
        for s in named(spans, "agentflow.tool")
    ]


async def test_a_run_across_two_workers_and_a_sigkill_is_one_trace_with_the_recovery_marked(deployment, tmp_path):
    # Given workers w1 and w2 that trace (AGENTFLOW_TRACING=1), each exporting its spans to a folder of its own,
    # and a client that traces too (it saves step 0: the run's start span is its)
    folders = {name: tmp_path / f"spans-{name}" for name in ("w1", "w2")}
    for name, folder in folders.items():
        folder.mkdir()
        deployment.worker_env[name] = {"AGENTFLOW_TRACING": "1", "AGENTFLOW_TEST_SPANS": str(folder)}
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    deployment.client.runner.executor.tracer = Tracing(provider)
    # When a ticket run's worker w1 is SIGKILLed inside charge_card (after the charge), w2 finds the call in
    # doubt and parks the run, an operator decides to rerun it, and w2 finishes the run
    run_id = await deployment.parked_run("w1", "w2")
    await deployment.client.decide_in_doubt(run_id)
    assert (await deployment.client.settle(run_id, timeout_s=30)).status == "done"

    def finished() -> list[dict[str, Any]] | None:
        w2 = exported(folders["w2"], run_id)
        done = [s for s in named(w2, "agentflow.superstep") if s["attributes"].get("agentflow.status") == "done"]
        return w2 if done else None

    w2 = await until(finished, "w2's span of the run's last superstep", timeout_s=10)
    w1 = exported(folders["w1"], run_id)

    # Then every span of both workers is in the one trace the client's start span began, each superstep its child
    (start,) = exporter.get_finished_spans()
    trace_id, start_id = f"0x{start.context.trace_id:032x}", f"0x{start.context.span_id:016x}"
    assert {s["context"]["trace_id"] for s in w1 + w2} == {trace_id}
    assert {s["parent_id"] for s in named(w1 + w2, "agentflow.superstep")} == {start_id}
    # and w1's one ended superstep held the seats; the superstep it died in never ended
    assert [s["attributes"]["agentflow.cause"] for s in named(w1, "agentflow.superstep")] == ["start"]
    assert calls(w1) == [("hold_seats", "ran")]
    # And w2's recovery is marked, linked to the span of the superstep w1 died in (its id is in the started record)
    worker = deployment.tasks.worker
    started = [
        worker.sealer.open_call(row, run_id) for row in await worker.store.calls(run_id) if row.kind == "started"
    ]
    died_in = next(f"0x{body['span']}" for body in started if body["tool"] == "charge_card")  # w1's, the first
    parked = [s for s in named(w2, "agentflow.superstep") if s["attributes"]["agentflow.status"] == "needs decision"]
    assert parked, w2
    for span in parked:
        assert (span["attributes"]["agentflow.cause"], span["attributes"]["agentflow.recovered"]) == ("recovery", True)
        assert [link["context"]["span_id"] for link in span["links"]] == [died_in]
    # and the call outcomes are attributes: in doubt (parked), rerun on the operator's decision, then the mail ran
    assert calls(w2)[-2:] == [("charge_card", "rerun"), ("email_tickets", "ran")]
    assert set(calls(w2)[:-2]) == {("charge_card", "in doubt")}
    in_doubt = {s["attributes"]["agentflow.call_id"] for s in named(w2, "agentflow.tool charge_card")}
    assert in_doubt == {next(body["call_id"] for body in started if body["tool"] == "charge_card")}
    causes = [s["attributes"]["agentflow.cause"] for s in named(w2, "agentflow.superstep")]
    assert causes[-2:] == ["decision", "handoff"]
