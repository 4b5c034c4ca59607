"""`Metrics` keeps its figures from the events of in-process runs: every counter, histogram and label rule."""

from __future__ import annotations

import urllib.request

import pytest
from _kit.poll import until
from _kit.tickets import FANOUT, TICKETS, Crash, make_tickets
from pydantic import BaseModel

from agentflow import Call, Events, Executor, Flow, FlowApp, FlowRunner, Registry
from agentflow.errors import RecoveryNeedsDecision
from agentflow.exec import run_tool_loop
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.exec.run.lease import Ownership, holding
from agentflow.models import Message, ScriptedModel, ToolCall
from agentflow.observe import Metrics, serve_metrics


class Out(BaseModel):
    out: int = 0


class Setup:
    """A runner on a memory store with the ticket tools, its events watched by a `Metrics`."""

    def __init__(self) -> None:
        self.tickets = make_tickets()
        self.events = Events()
        self.store = MemoryCheckpointStore()
        self.runner = FlowRunner(Executor(self.tickets.registry, events=self.events), checkpoints=self.store)
        self.metrics = Metrics()
        self.metrics.watch(self.events)

    def value(self, name: str, **labels: str) -> float:
        """A sample's value (0 for a series that does not exist)."""
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def m() -> Setup:
    return Setup()


async def test_a_run_counts_its_start_its_supersteps_its_calls_and_its_end(m):
    # When a ticket run goes from start to done
    result = await m.runner.run(TICKETS, {"show": "Hamlet"})
    assert result.status == "done"
    # Then it started and finished once, made three supersteps and three calls that ended ok
    assert m.value("agentflow_runs_started_total", flow="tickets") == 1
    assert m.value("agentflow_runs_finished_total", flow="tickets", status="done") == 1
    assert m.value("agentflow_superstep_seconds_count", flow="tickets") == 3
    assert m.value("agentflow_superstep_seconds_sum", flow="tickets") > 0
    for tool in ("hold_seats", "charge_card", "email_tickets"):
        assert m.value("agentflow_tool_call_seconds_count", tool=tool, outcome="ok") == 1
    # and nothing else happened to it
    assert m.value("agentflow_recoveries_total", flow="tickets") == 0
    assert m.value("agentflow_runs_paused_total", flow="tickets") == 0


async def test_a_recovery_counts_the_claim_and_the_call_it_reran(m):
    # Given a run whose worker died inside hold_seats (idempotent) after its effect
    m.tickets.crash_in.add("hold_seats")
    with pytest.raises(Crash):
        await m.runner.run(TICKETS, {"show": "Hamlet"}, run_id="r1")
    # When it is recovered
    result = await m.runner.recover(TICKETS, "r1")
    # Then one recovery is counted, and hold_seats as a call in doubt that ran again
    assert result.status == "done"
    assert m.value("agentflow_recoveries_total", flow="tickets") == 1
    assert m.value("agentflow_calls_rerun_total", tool="hold_seats") == 1
    assert m.tickets.counts("r1")["hold_seats"] == 2
    # and the run started once and finished once
    assert m.value("agentflow_runs_started_total", flow="tickets") == 1
    assert m.value("agentflow_runs_finished_total", flow="tickets", status="done") == 1


async def test_an_operators_decision_on_a_call_in_doubt_is_counted_with_its_rerun(m):
    # Given a run whose worker died inside charge_card (not idempotent: in doubt), and an
    # operator's signed word that it did not happen
    m.tickets.crash_in.add("charge_card")
    with pytest.raises(Crash):
        await m.runner.run(TICKETS, {"show": "Hamlet"}, run_id="r1")
    with pytest.raises(RecoveryNeedsDecision):
        await m.runner.recover(TICKETS, "r1")
    await m.runner.decide_in_doubt(TICKETS, "r1", operator="ops")
    # When the run is recovered with that decision
    result = await m.runner.recover(TICKETS, "r1")
    # Then the decision and the rerun are counted
    assert result.status == "done"
    assert m.value("agentflow_decisions_total", flow="tickets", decision="in_doubt") == 1
    assert m.value("agentflow_calls_rerun_total", tool="charge_card") == 1


async def test_a_pause_and_its_approval_are_counted(m):
    # Given a run that pauses for an approval of wire_money
    paused = await m.runner.run(FANOUT, {"show": "Hamlet"}, run_id="f1")
    assert paused.status == "paused"
    assert m.value("agentflow_runs_paused_total", flow="fanout") == 1
    # When a person approves it
    result = await m.runner.resume(FANOUT, "f1", approve=True, operator="alice")
    # Then the decision is counted, and the calls that finished before the pause replayed
    assert result.status == "done"
    assert m.value("agentflow_decisions_total", flow="fanout", decision="approval") == 1
    assert m.value("agentflow_calls_replayed_total", tool="charge_card") == 1
    assert m.value("agentflow_runs_finished_total", flow="fanout", status="done") == 1


async def test_a_cancel_is_a_decision_and_an_end(m):
    # Given a paused run
    await m.runner.run(FANOUT, {"show": "Hamlet"}, run_id="f1")
    # When an operator cancels it
    await m.runner.cancel(FANOUT, "f1", reason="customer left", operator="alice")
    # Then it counts as a cancel decision and a run that ended cancelled
    assert m.value("agentflow_decisions_total", flow="fanout", decision="cancel") == 1
    assert m.value("agentflow_runs_finished_total", flow="fanout", status="cancelled") == 1


async def test_a_failed_call_is_timed_as_failed_and_the_run_as_failed(m):
    # Given a tool that raises
    registry = Registry()

    @registry.tool
    async def flaky(n: int) -> int:
        raise ValueError("no")

    flow = Flow("flaky", state=Out).node("f", Call("flaky", args={"n": 1}, into="out")).end("f")
    runner = FlowRunner(Executor(registry, events=m.events), checkpoints=m.store)
    # When a run calls it
    result = await runner.run(flow, {})
    # Then the attempt is timed with outcome failed, and the run ended failed
    assert result.status == "failed"
    assert m.value("agentflow_tool_call_seconds_count", tool="flaky", outcome="failed") == 1
    assert m.value("agentflow_runs_finished_total", flow="flaky", status="failed") == 1


async def test_a_tool_loop_counts_under_its_column(m):
    # Given a tool loop whose model asks for one tool, then answers
    registry = Registry()

    @registry.tool(idempotent=True)
    async def forecast(city: str) -> str:
        return f"sunny in {city}"

    model = ScriptedModel(
        [
            Message.assistant(tool_calls=[ToolCall(id="c1", name="forecast", arguments={"city": "Oslo"})]),
            Message.assistant("sunny"),
        ]
    )
    # When it runs to its answer
    result = await run_tool_loop(
        model, registry, [Message.user("weather?")], checkpoints=m.store, name="weather", events=m.events
    )
    # Then it counts as a run of loop:weather: started, two stages, done
    assert result.status == "done"
    assert m.value("agentflow_runs_started_total", flow="loop:weather") == 1
    assert m.value("agentflow_superstep_seconds_count", flow="loop:weather") == 3
    assert m.value("agentflow_runs_finished_total", flow="loop:weather", status="done") == 1
    assert m.value("agentflow_tool_call_seconds_count", tool="forecast", outcome="ok") == 1


async def test_a_lease_found_lost_is_counted(m):
    # Given a holder whose lease is renewed every 30 ms
    ownership = Ownership("w@host:1", lease_s=0.09, events=m.events)
    async with holding(m.store, "r1", ownership) as held:
        # When the lease is released behind its back (as if it lapsed and another took it)
        await m.store.release_lease("r1", held.lease.token)
        # Then its next renewal reports it lost
        await until(lambda: m.value("agentflow_leases_lost_total") == 1, "the lost lease counted", timeout_s=5)


async def test_priming_gives_every_series_of_the_app_a_zero(m):
    # Given the metrics primed with an app's flows and tools
    m.metrics.prime(FlowApp(m.tickets.registry, [TICKETS, FANOUT]))
    # Then the series exist at 0 before anything happens (a rule's increase() sees the first one)
    assert m.metrics.registry.get_sample_value("agentflow_recoveries_total", {"flow": "tickets"}) == 0
    assert m.metrics.registry.get_sample_value("agentflow_calls_in_doubt_total", {"tool": "charge_card"}) == 0
    assert m.metrics.registry.get_sample_value("agentflow_control_refused_total", {"kind": "resume"}) == 0


async def test_no_label_is_a_run_id_or_a_call_id_and_forged_kinds_fold_into_other(m):
    # Given runs that started, crashed, recovered and paused
    m.tickets.crash_in.add("hold_seats")
    with pytest.raises(Crash):
        await m.runner.run(TICKETS, {"show": "Hamlet"}, run_id="run-secret-1")
    await m.runner.recover(TICKETS, "run-secret-1")
    await m.runner.run(FANOUT, {"show": "Hamlet"}, run_id="run-secret-2")
    # and a refused control message naming a cause no worker sends
    m.events.emit("control.refused", "run-secret-3", cause="rerun-everything-now", why="forged")
    # When the metrics are served and read as Prometheus reads them
    server = serve_metrics(m.metrics.registry, port=0)
    try:
        assert server.server.server_address[0] == "127.0.0.1"
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://127.0.0.1:{server.port}/metrics", timeout=5
        ) as resp:
            text = resp.read().decode()
    finally:
        server.close()
    # Then no run id and no call id is in any series, and the forged cause counts as "other"
    assert "agentflow_runs_started_total" in text
    assert "run-secret" not in text and "/hold/" not in text
    assert 'agentflow_control_refused_total{kind="other"} 1.0' in text
