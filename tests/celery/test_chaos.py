"""Chaos soak: ticket runs flow through 3 prefork workers and beat while workers are SIGKILLed at random.

It runs on two configurations: one Redis as broker and store (the default), and the
scale-out one, RabbitMQ as the broker and PostgreSQL as the store (`rabbit_kit`).
Bounded for ``make test`` at its shortest meaningful length: 12 s of chaos (a kill every
1.75 s on average: about 7, main processes and pool children) over 32 runs (8 of them agent
runs) on Redis, half of each on RabbitMQ + PostgreSQL. ``make soak`` runs the long form (600 s
and 500 runs on each), or set them::

    AGENTFLOW_CHAOS_SECONDS=600 AGENTFLOW_CHAOS_RUNS=500 .venv/bin/pytest tests/celery/test_chaos.py -s

At the end: no run is lost (every run is done, after an operator decided about the runs
waiting for a decision), no non-idempotent tool had an effect twice unless its call was
in doubt and the operator chose to rerun it (then at most once more), and every call in
doubt is accounted for.

Durable pydantic-ai agent runs (the order agent, `_kit.agents`, as the loop ``orders``: one
per four ticket runs) go through the same chaos alongside. Their operator is honest: a
``charge`` in doubt that the ledger shows happened is `Happened`, one that did not is
rerun; so every agent run ends done with the expected output, its card charged exactly once.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest
from _kit.agents import EXPECTED, PROMPT, charge_result
from _kit.tickets import Ledger, Order
from celery_kit import Deployment
from rabbit_kit import rabbitmq_vhost, scale_out_deployment

from agentflow import Happened, InDoubtDecision, Rerun
from agentflow.celery import RunView
from agentflow.errors import RunHeld

SECONDS = float(os.environ.get("AGENTFLOW_CHAOS_SECONDS", "12"))
RUNS = int(os.environ.get("AGENTFLOW_CHAOS_RUNS", "32"))
#: The share of SECONDS and RUNS the soak on RabbitMQ + PostgreSQL takes unless they are set.
SCALE_OUT_SHARE = 1.0 if "AGENTFLOW_CHAOS_SECONDS" in os.environ else 1 / 2
WORKERS = 3
#: Time for the runs to settle once the chaos stopped (lapsed leases, beat, reruns).
SETTLE_S = 180.0

__all__ = ["rabbitmq_vhost", "scale_out_deployment"]  # the scale-out deployment's fixtures, used by `soak`

pytestmark = [
    pytest.mark.celery,
    pytest.mark.slow,
    pytest.mark.timeout(int(SECONDS + SETTLE_S + 120)),
]


@dataclass
class Soak:
    """One configuration's soak: its deployment, how long the chaos lasts, how many runs go through."""

    deployment: Deployment
    name: str
    seconds: float
    runs: int


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("rabbitmq+postgresql", marks=pytest.mark.postgres),
    ]
)
def soak(request: pytest.FixtureRequest) -> Soak:
    if request.param == "redis":
        return Soak(request.getfixturevalue("deployment"), "Redis", SECONDS, RUNS)
    share = SCALE_OUT_SHARE
    return Soak(request.getfixturevalue("scale_out_deployment"), "RabbitMQ + PostgreSQL", SECONDS * share,
                max(1, int(RUNS * share)))  # fmt: skip


NON_IDEMPOTENT = ("charge_card", "email_tickets")
#: The durable agent the app registers (`celery_flows`), and one of its runs per this many ticket runs.
AGENT = "orders"
TICKET_RUNS_PER_AGENT_RUN = 4


@dataclass
class Chaos:
    """What the monkey did."""

    main_kills: int = 0
    child_kills: int = 0
    started: int = 0
    exited: int = 0
    alive: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)


async def _produce(deployment: Deployment, runs: int, run_ids: list[str], until: float) -> None:
    """Start `runs` ticket runs, spread over the time until `until`."""
    gap = max(0.0, (until - time.monotonic()) / runs)
    for i in range(runs):
        run_ids.append(await deployment.client.start("tickets", {"show": f"show-{i}", "seats": 1 + i % 4}))
        await asyncio.sleep(random.uniform(0, 2 * gap))


async def _produce_agents(deployment: Deployment, runs: int, run_ids: list[str], until: float) -> None:
    """Start `runs` agent runs of the order agent, spread over the time until `until`."""
    gap = max(0.0, (until - time.monotonic()) / runs)
    for _ in range(runs):
        run_ids.append(await deployment.client.start_agent(AGENT, PROMPT))
        await asyncio.sleep(random.uniform(0, 2 * gap))


async def _monkey(deployment: Deployment, chaos: Chaos, until: float, rng: random.Random) -> None:
    """SIGKILL a worker's main process or one of its pool children every few seconds; replace dead workers."""
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(0.5, 3.0))
        _restart_exited(deployment, chaos)
        victim = rng.choice(chaos.alive)
        if rng.random() < 0.5:
            deployment.kill(victim)
            chaos.main_kills += 1
            _replace(deployment, chaos, victim, "main killed")
        else:
            children = deployment.children(victim)
            if not children:  # still starting, or between two pool processes
                continue
            child = rng.choice(children)
            try:
                os.kill(child, 9)
            except ProcessLookupError:
                continue
            chaos.child_kills += 1
            chaos.log.append(f"{time.monotonic():.1f} child {child} of {victim}")


def _replace(deployment: Deployment, chaos: Chaos, dead: str, why: str) -> None:
    """Start a new worker in place of `dead`, without waiting: it comes up as a restarted container would."""
    chaos.alive.remove(dead)
    chaos.started += 1
    name = f"w{chaos.started}"
    deployment.start_worker(name, wait=False)
    chaos.alive.append(name)
    chaos.log.append(f"{time.monotonic():.1f} {dead} {why} -> {name}")


def _restart_exited(deployment: Deployment, chaos: Chaos) -> None:
    """Replace workers that exited on their own (a pool child killed while the worker was starting up
    makes Celery give up with "Could not start worker processes", as a restart policy would handle)."""
    for name in list(chaos.alive):
        if deployment.procs[name].poll() is not None:
            chaos.exited += 1
            _replace(deployment, chaos, name, "exited")


async def _all_up(deployment: Deployment, chaos: Chaos, timeout_s: float = 90.0) -> None:
    """Wait until every worker answers a ping, replacing those that exited meanwhile."""
    deadline = time.monotonic() + timeout_s
    host = socket.gethostname()
    while True:
        _restart_exited(deployment, chaos)
        replies = deployment.celery_app.control.ping(destination=[f"{n}@{host}" for n in chaos.alive], timeout=1.0)
        answered = {name.split("@")[0] for reply in replies or [] for name in reply}
        if answered >= set(chaos.alive) and all(deployment.procs[n].poll() is None for n in chaos.alive):
            return
        assert time.monotonic() < deadline, (sorted(set(chaos.alive) - answered), chaos.log)
        await asyncio.sleep(0.5)


def _idempotency_keys(deployment: Deployment) -> dict[tuple[str, str], list[str]]:
    keys: dict[tuple[str, str], list[str]] = defaultdict(list)
    for effect in Ledger(deployment.ledger).entries():
        keys[(effect.tool, effect.run_id)].append(effect.key)
    return keys


def _in_doubt_tools(reason: str) -> list[str]:
    """The tools a parked run waits for a decision about (`RunView.waiting_for_decision`: "tool: why; tool: why")."""
    return [part.split(":", 1)[0].strip() for part in reason.split("; ") if part.strip()]


async def _settle(
    deployment: Deployment, run_ids: list[str], deadline: float
) -> tuple[dict[str, RunView], dict[str, list[str]]]:
    """Poll every run until it is done, deciding (rerun) the calls in doubt as an operator would."""
    pending = set(run_ids)
    views: dict[str, RunView] = {}
    decided: dict[str, list[str]] = {}
    while pending and time.monotonic() < deadline:
        for run_id in sorted(pending):
            view = await deployment.client.status(run_id)
            views[run_id] = view
            if view.status == "done":
                pending.discard(run_id)
            elif view.status in ("failed", "paused"):
                raise AssertionError(f"run {run_id} ended {view.status}: {view.error}")
            elif view.waiting_for_decision:
                decided.setdefault(run_id, []).extend(_in_doubt_tools(view.waiting_for_decision))
                await deployment.client.decide_in_doubt(run_id)
        await asyncio.sleep(0.5)
    lost = {r: (views[r].status, views[r].step, views[r].waiting_for_decision) for r in pending}
    assert not lost, f"{len(lost)} run(s) never finished: {lost}"
    return views, decided


@dataclass(frozen=True)
class AgentDecision:
    """One call in doubt of an agent run, and what the operator said about it."""

    run_id: str
    tool: str
    call_id: str
    happened: bool  # the ledger showed the effect: `Happened`; else `Rerun`


async def _decide_honestly(deployment: Deployment, run_id: str) -> list[AgentDecision] | None:
    """Decide the calls in doubt of a parked agent run as a person checking the card's statement would.

    A ``charge`` the ledger shows happened is `Happened` (with the result charge returns), one
    it does not show is rerun. Only ``charge`` is not idempotent: nothing else may park the run.
    None when a worker holds the run just then (a sweep looking at it): asked again on the next poll.
    """
    report = await deployment.report(run_id)
    if report.lease is not None:
        return None
    assert {tool for tool, _ in report.awaiting} == {"charge"}, (run_id, report.awaiting, report.calls)
    doubtful = report.in_doubt
    assert doubtful and {c.tool for c in doubtful} <= {"charge", "lookup_order"}, (run_id, report.calls)
    charged = deployment.effects()[("charge", run_id)] >= 1
    made = [AgentDecision(run_id, c.tool, c.call_id, charged) for c in doubtful if c.tool == "charge"]
    assert made, (run_id, report.awaiting, report.calls)
    calls: dict[str, InDoubtDecision] = {
        d.call_id: Happened(charge_result("A1", 90)) if d.happened else Rerun() for d in made
    }  # an idempotent lookup_order left out reruns
    try:
        await deployment.client.decide_in_doubt(run_id, calls=calls, operator="chaos")
    except RunHeld:  # a worker took the run since the report was read
        return None
    return made


async def _settle_agents(
    deployment: Deployment, run_ids: list[str], deadline: float
) -> tuple[dict[str, RunView], list[AgentDecision]]:
    """Poll every agent run until it is done, deciding its calls in doubt as an honest operator would."""
    pending = set(run_ids)
    results: dict[str, RunView] = {}
    decisions: list[AgentDecision] = []
    last: dict[str, str] = {}
    while pending and time.monotonic() < deadline:
        for run_id in sorted(pending):
            try:  # one read: settled (ended, or parked waiting for a decision) or not yet
                result = await deployment.client.settle(run_id, timeout_s=0.0)
            except TimeoutError as moving:
                last[run_id] = str(moving)
                continue
            last[run_id] = result.status
            if result.waiting_for_decision:  # parked on calls in doubt
                decisions.extend(await _decide_honestly(deployment, run_id) or [])
                continue
            assert (result.kind, result.name) == ("agent", AGENT), result
            if result.status != "done":
                raise AssertionError(f"agent run {run_id} ended {result.status}: {result.error}")
            results[run_id] = result
            pending.discard(run_id)
        await asyncio.sleep(0.5)
    lost = {r: last.get(r) for r in sorted(pending)}
    assert not lost, f"{len(lost)} agent run(s) never finished: {lost}"
    return results, decisions


async def test_chaos_soak_loses_no_run_and_repeats_no_effect(soak: Soak) -> None:
    deployment, seconds, runs = soak.deployment, soak.seconds, soak.runs
    rng = random.Random(os.environ.get("AGENTFLOW_CHAOS_SEED") or None)
    began = time.monotonic()
    # Given three prefork workers (-c 2), beat, and ticket tools that take a little time
    deployment.set_delay(0.01, 0.08)
    chaos = Chaos()
    for _ in range(WORKERS):  # started side by side, then waited for
        chaos.started += 1
        deployment.start_worker(f"w{chaos.started}", wait=False)
        chaos.alive.append(f"w{chaos.started}")
    for name in chaos.alive:
        deployment.wait_ready(name)
    deployment.start_beat()
    # When runs flow in while workers' main processes and pool children are SIGKILLed at random
    # (and, alongside, durable agent runs: one per four ticket runs)
    run_ids: list[str] = []
    agent_ids: list[str] = []
    agent_runs = max(1, runs // TICKET_RUNS_PER_AGENT_RUN)
    until = time.monotonic() + seconds
    await asyncio.gather(
        _produce(deployment, runs, run_ids, until - seconds * 0.15),
        _produce_agents(deployment, agent_runs, agent_ids, until - seconds * 0.15),
        _monkey(deployment, chaos, until, rng),
    )
    await _all_up(deployment, chaos)
    # and an operator reruns the calls in doubt of every run that waits for a decision (of an agent
    # run: says Happened to a charge the ledger shows, reruns one it does not)
    deadline = time.monotonic() + SETTLE_S
    (views, decided), (agent_results, agent_decisions) = await asyncio.gather(
        _settle(deployment, run_ids, deadline), _settle_agents(deployment, agent_ids, deadline)
    )
    duration = time.monotonic() - began

    # Then no run was lost: every one is done
    assert len(run_ids) == runs
    assert {v.status for v in views.values()} == {"done"}
    assert all(isinstance(v.state, Order) and v.state.sent == f"mailed {v.state.show}" for v in views.values())
    # and no non-idempotent tool had an effect twice, except a call in doubt that the operator reran (once more)
    effects = deployment.effects()
    duplicates, reruns_without_effect = [], 0
    for run_id in run_ids:
        in_doubt = Counter(decided.get(run_id, []))
        for tool in NON_IDEMPOTENT:
            count = effects[(tool, run_id)]
            assert count >= 1, (run_id, tool, "never ran")
            assert count <= 1 + in_doubt[tool], (run_id, tool, count, decided.get(run_id), chaos.log)
            if count > 1:
                duplicates.append((run_id, tool))
            reruns_without_effect += in_doubt[tool] - (count - 1)
    # and every call in doubt is accounted for: a non-idempotent tool whose rerun, when the first try had
    # already had its effect, carried the same idempotency key (so the system it calls can tell)
    named = Counter(tool for tools in decided.values() for tool in tools)
    assert set(named) <= set(NON_IDEMPOTENT), named
    keys = _idempotency_keys(deployment)
    for run_id, tool in duplicates:
        assert len(set(keys[(tool, run_id)])) == 1, (run_id, tool, keys[(tool, run_id)])
    hold_reruns = sum(effects[("hold_seats", r)] - 1 for r in run_ids)
    # And every agent run is done with the expected output, its card charged exactly once (an honest
    # operator never causes a second charge: any duplicate is a bug), its order looked up
    assert len(agent_ids) == agent_runs and set(agent_results) == set(agent_ids)
    assert not set(agent_ids) & set(run_ids)
    for run_id in agent_ids:
        result = agent_results[run_id]
        assert result.status == "done" and result.output == EXPECTED, (run_id, result.status, result.output)
        charges = effects[("charge", run_id)]
        mine = [d for d in agent_decisions if d.run_id == run_id]
        assert charges == 1, (run_id, "charged", charges, mine, chaos.log)
        assert effects[("lookup_order", run_id)] >= 1, (run_id, "lookup_order never ran")
    happened = sum(d.happened for d in agent_decisions)
    agent_charges = sum(effects[("charge", r)] for r in agent_ids)
    lookup_reruns = sum(effects[("lookup_order", r)] - 1 for r in agent_ids)

    print(
        f"\nchaos soak on {soak.name}: {len(run_ids)} runs, {runs * 3} supersteps, {duration:.0f} s "
        f"({seconds:.0f} s of chaos); kills: {chaos.main_kills} main processes (replaced), "
        f"{chaos.child_kills} pool children; workers started: {chaos.started} "
        f"({chaos.exited} replaced after exiting on their own); "
        f"decisions: {len(decided)} runs, {sum(named.values())} calls in doubt {dict(named)}, "
        f"of which {len(duplicates)} had already had their effect (rerun = one extra) and "
        f"{reruns_without_effect} had not; idempotent hold_seats reruns: {hold_reruns}; "
        f"agent runs: {len(agent_ids)}, decisions: {len(agent_decisions)} charges in doubt over "
        f"{len({d.run_id for d in agent_decisions})} runs ({happened} happened, "
        f"{len(agent_decisions) - happened} rerun), charges: {agent_charges}, "
        f"idempotent lookup_order reruns: {lookup_reruns}; "
        f"lost runs: 0; unexplained duplicate effects: 0"
    )
    assert chaos.main_kills + chaos.child_kills > 0
