"""The acting commands through a deployment's workers (``--workers``): the tools run on the workers, never in the CLI.

One deployment for the module (its own Redis prefix, queue and key; one Celery worker ``w1``
started once). Each command runs as a process of its own with the deployment's settings
and ``--workers workers.celery_app:tasks`` (or ``$AGENTFLOW_WORKERS``); every ledger line
of the run it acts on names the process that had the effect: one of the worker's pool,
never the command's.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from _kit.poll import until
from cli_workers_kit import (
    ROOT,
    WORKERS,
    agentflow,
    assert_ran_on_the_workers,
    client_of,
    deployment,
    effects,
    failed,
    gate,
    in_doubt,
    stranded,
)
from click.testing import CliRunner
from runs_kit import one_line_error

from agentflow._errors import RunHeld
from agentflow.cli._group import cli
from agentflow.exec.calls.read import read_log

if TYPE_CHECKING:
    from celery_kit import Deployment

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(120)]

TOOLS = ["hold_seats", "charge_card", "email_tickets"]


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Deployment]:
    made = deployment(tmp_path_factory.mktemp("deployment"), redis_url)
    yield made
    made.close()


async def test_recover_runs_the_named_run_on_a_worker_and_leaves_the_others(dep: Deployment) -> None:
    # Given two ticket runs of the same flow that nobody moves (their first message never went out)
    async with client_of(dep) as client:
        one = await stranded(client, "tickets", f"{dep.prefix}-one", show="Aida")
        other = await stranded(client, "tickets", f"{dep.prefix}-other", show="Tosca")
    # When the operator recovers the first through the workers (--rerun-in-doubt: it has no call in doubt,
    # so it is recovered as without)
    args = ["recover", one, "--rerun-in-doubt", "--workers", WORKERS, "--as", "ana"]
    ran = await asyncio.to_thread(agentflow, dep, *args)
    # Then it is done, a worker ran every tool of it, and the command waited for it and says who ran it
    assert ran.code == 0, ran.output
    assert f"{one}  done     by w1@" in ran.stdout and "replayed 0 call(s), reran 0" in ran.stdout
    assert_ran_on_the_workers(dep, ran, one, TOOLS)
    # And the other run was not touched
    assert effects(dep, other) == []
    async with client_of(dep) as client:
        view = await client.status(other)
    assert (view.status, view.step) == ("running", 0)


async def test_a_call_in_doubt_waits_for_a_decision_then_reruns_on_a_worker_when_told(dep: Deployment) -> None:
    # Given a ticket run whose process died inside charge_card (not idempotent)
    async with client_of(dep) as client:
        run_id = await in_doubt(client, f"{dep.prefix}-doubt", "Norma")
    # When it is recovered through the workers ($AGENTFLOW_WORKERS) without a decision
    first = await asyncio.to_thread(agentflow, dep, "recover", run_id, env={"AGENTFLOW_WORKERS": WORKERS})
    # Then a worker parks it on the call in doubt and nothing ran again
    assert first.code == 1, first.output
    assert f"{run_id}  needs a decision  in doubt: charge_card" in first.stdout
    assert f"then agentflow decide {run_id} --workers {WORKERS} --call CALL_ID=" in first.stdout
    assert "--rerun-in-doubt" not in first.stdout  # the hint asks per call: the charge may have happened
    assert effects(dep, run_id) == []
    # When the operator checked the bank and recovers it with --rerun-in-doubt
    second = await asyncio.to_thread(
        agentflow, dep, "recover", run_id, "--rerun-in-doubt", "--as", "ops", env={"AGENTFLOW_WORKERS": WORKERS}
    )
    # Then a worker reran the charge and mailed the tickets, under the operator's signed decision
    assert second.code == 0, second.output
    assert "reran 1" in second.stdout
    assert_ran_on_the_workers(dep, second, run_id, ["charge_card", "email_tickets"])
    async with client_of(dep) as client:
        view = await client.status(run_id)
    assert view.status == "done" and any(s.operator == "ops" for s in view.segments), view.segments


async def test_recover_leaves_a_run_a_live_worker_holds_alone(dep: Deployment) -> None:
    # Given two reports nobody moves, one of them held by a live worker elsewhere
    async with client_of(dep) as client:
        held = await stranded(client, "slow", f"{dep.prefix}-held", show="held")
        free = await stranded(client, "slow", f"{dep.prefix}-free", show="free")
        store = client.runner.checkpoints
        assert store is not None
        lease = await store.take_lease(held, "worker-7@host-b:4242", "token-b", 60.0)
    # When every unfinished run of the flow is recovered through the workers, without waiting
    args = ["recover", "--flow", "slow", "--yes", "--no-wait", "--workers", WORKERS]
    ran = await asyncio.to_thread(agentflow, dep, *args)
    # Then both are listed first; the held one is reported held by its worker and the other is enqueued
    assert ran.code == 0, ran.output
    lines = ran.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("RUN") and "OUTCOME" in line)
    listed, summary = "\n".join(lines[:at]), "\n".join(lines[at:])
    assert held in listed and free in listed and f"live on {lease.owner}" in listed
    assert f"{held}  held      held by worker-7@host-b:4242 until " in summary
    assert f"{free}  enqueued  a recovery from step 0: a worker carries it on" in summary
    assert "1 run(s) are live on their workers and were left alone" in ran.stdout
    # And a worker ran the free one; the held one is as it was
    async with client_of(dep) as client:
        assert (await client.settle(free, timeout_s=30)).status == "done"
        assert (await client.status(held)).step == 0
        with pytest.raises(RunHeld):
            await client.recover(held)
        store = client.runner.checkpoints
        assert store is not None
        await store.release_lease(held, "token-b")
    assert [e.tool for e in effects(dep, free)] == ["slow_report"] and effects(dep, held) == []


async def test_a_run_that_does_not_settle_in_time_is_reported_and_left_to_the_workers(dep: Deployment) -> None:
    # Given a report that takes a second, nobody moving it
    async with client_of(dep) as client:
        run_id = await stranded(client, "slow", f"{dep.prefix}-slow", show="long", seconds=1.0)
    # When it is recovered through the workers, waiting a fifth of a second
    ran = await asyncio.to_thread(agentflow, dep, "recover", run_id, "--timeout", "0.2", "--workers", WORKERS)
    # Then the command says it is still running and that the workers carry it on (not recovered: yet)
    assert ran.code == 1, ran.output
    assert f"{run_id}  still running  at step " in ran.stdout and "the workers carry it on" in ran.stdout
    # And a worker finishes it
    async with client_of(dep) as client:
        assert (await client.settle(run_id, timeout_s=30)).status == "done"
    assert_ran_on_the_workers(dep, ran, run_id, ["slow_report"])


async def test_resume_runs_the_approved_call_on_a_worker(dep: Deployment) -> None:
    # Given a run a worker paused for approval of wire_money
    async with client_of(dep) as client:
        run_id = await client.start("fanout", {"show": "Lulu"})
        assert (await client.settle(run_id, timeout_s=30)).status == "paused"
    # When the operator approves it through the workers
    ran = await asyncio.to_thread(agentflow, dep, "resume", run_id, "--approve", "--as", "ana", "--workers", WORKERS)
    # Then a worker wired the money and finished the run; the command says so once it is done
    assert ran.code == 0, ran.output
    assert ran.stdout.startswith(f"run {run_id}: approved; now done at step ")
    assert "(by w1@" in ran.stdout
    assert_ran_on_the_workers(dep, ran, run_id, ["hold_seats", "charge_card", "wire_money"])


async def test_retry_decide_and_fork_run_their_tools_on_a_worker(dep: Deployment) -> None:
    async with client_of(dep) as client:
        broken = await failed(client, f"{dep.prefix}-failed", "Werther")
        doubt = await in_doubt(client, f"{dep.prefix}-decided", "Carmen")
        store = client.runner.checkpoints
        assert store is not None
        records = await read_log(store, client.sealer, doubt)
    (charge,) = [r.body["call_id"] for r in records if r.kind == "started" and r.body.get("tool") == "charge_card"]
    # When the operator retries the failed run through the workers
    retried = await asyncio.to_thread(agentflow, dep, "retry", broken, "--as", "ivy", "--workers", WORKERS)
    # Then a worker runs it from the superstep that failed to its end
    assert retried.code == 0, retried.output
    assert f"run {broken}: retried; now done at step " in retried.stdout
    assert_ran_on_the_workers(dep, retried, broken, TOOLS)
    # When the operator says the charge in doubt happened, with its result
    word = f'{charge}=happened:"charged 80 for Carmen"'
    decided = await asyncio.to_thread(agentflow, dep, "decide", doubt, "--call", word, "--workers", WORKERS)
    # Then a worker finishes the run without charging again: only the mail ran
    assert decided.code == 0, decided.output
    assert f"run {doubt}: decision stored at step " in decided.stdout
    assert "a worker acted on it: now done" in decided.stdout
    assert_ran_on_the_workers(dep, decided, doubt, ["email_tickets"])
    # When the operator forks the decided run from its step 1 (seats held) with another show, under a new id
    new_id = f"{dep.prefix}-forked"
    forked = await asyncio.to_thread(
        agentflow, dep, "fork", doubt, "--at", "1", "--patch", '{"show": "Otello"}', "--new-id", new_id,
        "--workers", WORKERS,
    )  # fmt: skip
    # Then a worker runs the new run's calls (new calls: they all run)
    assert forked.code == 0, forked.output
    assert f"run {new_id} forked from {doubt} at step 1: now done at step " in forked.stdout
    assert_ran_on_the_workers(dep, forked, new_id, ["charge_card", "email_tickets"])


async def test_cancel_through_the_workers_ends_an_idle_run_at_once_and_a_live_one_through_its_worker(
    dep: Deployment,
) -> None:
    # Given a run nobody moves, and one whose worker is writing a report (until the test says) before it mails
    async with client_of(dep) as client:
        idle = await stranded(client, "tickets", f"{dep.prefix}-idle", show="Lakmé")
        busy = await client.start("late_mail", {"show": "busy"})
        store = client.runner.checkpoints
        assert store is not None
        await until(lambda: store.leases([busy]), f"a worker holding {busy}")
        # When the operator cancels both through the workers (the report finishes once the request is stored)
        commands = asyncio.gather(
            asyncio.to_thread(agentflow, dep, "cancel", idle, "--reason", "sold out", "--workers", WORKERS),
            asyncio.to_thread(agentflow, dep, "cancel", busy, "--reason", "too slow", "--workers", WORKERS),
        )
        # (a command takes seconds to start on a loaded machine)
        await until(lambda: store.peek_markers([f"cancel/{busy}"]), f"a cancel request for {busy}", timeout_s=60)
        gate(dep.ledger, "busy").touch()
        now, asked = await commands
    # Then the idle one is cancelled at once, and nothing of it ran
    assert now.code == 0, now.output
    assert now.stdout.strip() == f"run {idle}: cancelled (sold out)"
    assert effects(dep, idle) == []
    # And the live one is cancelled by its worker once its call in flight finished, before the mail (the command waited)
    assert asked.code == 0, asked.output
    assert f"run {busy}: cancelled (too slow) by the worker that held it: now cancelled at step " in asked.stdout
    assert "(by w1@" in asked.stdout
    assert_ran_on_the_workers(dep, asked, busy, ["report_when_told"])


async def test_decide_through_the_workers_exits_1_when_the_run_then_fails(dep: Deployment) -> None:
    # Given a ticket run whose process died inside charge_card (not idempotent)
    async with client_of(dep) as client:
        run_id = await in_doubt(client, f"{dep.prefix}-declined", "Salome")
        store = client.runner.checkpoints
        assert store is not None
        records = await read_log(store, client.sealer, run_id)
    (charge,) = [r.body["call_id"] for r in records if r.kind == "started" and r.body.get("tool") == "charge_card"]
    # When the operator checked the bank, which declined the card, and says so through the workers
    word = f"{charge}=not:the bank declined the card"
    ran = await asyncio.to_thread(agentflow, dep, "decide", run_id, "--call", word, "--workers", WORKERS)
    # Then a worker acted on it, the charge failed with that reason and so did the run: the command exits 1,
    # as retry does, having said where the run landed
    assert ran.code == 1, ran.output
    assert f"run {run_id}: decision stored at step " in ran.stdout
    assert "a worker acted on it: now failed at step " in ran.stdout
    last = ran.stderr.splitlines()[-1]
    assert last.startswith(f"agentflow: run '{run_id}' failed: ") and "the bank declined the card" in last
    # And no tool ran again: not the charge, and not the mail after it
    assert effects(dep, run_id) == []


async def test_a_command_through_the_workers_says_what_it_waits_for_and_each_change_of_status(dep: Deployment) -> None:
    # Given a report that takes a second, nobody moving it
    async with client_of(dep) as client:
        run_id = await stranded(client, "slow", f"{dep.prefix}-watched", show="watched", seconds=1.0)
    # When the operator recovers it through the workers (stderr is no terminal: lines, no spinner)
    ran = await asyncio.to_thread(agentflow, dep, "recover", run_id, "--workers", WORKERS)
    # Then stderr says which run it waits for and for what, then each status the run went through, by whom
    # (the deployment's store may warn first, about how the Redis it uses keeps data)
    assert ran.code == 0, ran.output
    lines = [line for line in ran.stderr.splitlines() if run_id in line]
    assert lines[0] == (
        f"waiting for run {run_id}: a worker carries it on until it ends, pauses or waits for a decision "
        "(up to 60 s; Ctrl-C stops the wait, not the run)"
    )
    assert lines[1].startswith(f"run {run_id}: now running at step ")  # 0, or 1 once a worker claimed it
    assert lines[2].startswith(f"run {run_id}: now done at step ") and "(by w1@" in lines[2]
    assert len(lines) == 3 and "\r" not in ran.stderr
    # And stdout is the command's summary, as it was
    assert ran.stdout.splitlines()[1].startswith(f"{run_id}  done     by w1@")


async def test_the_reading_commands_read_the_deployments_store_with_workers(dep: Deployment) -> None:
    # Given a ticket run the workers finished
    async with client_of(dep) as client:
        run_id = await client.start("tickets", {"show": "Fidelio"})
        assert (await client.settle(run_id, timeout_s=30)).status == "done"
    # When the operator lists, shows, verifies it and prints its events through the workers (no store, no key given)
    listed, shown, verified, events = await asyncio.gather(
        asyncio.to_thread(agentflow, dep, "runs", "list", "--workers", WORKERS),
        asyncio.to_thread(agentflow, dep, "runs", "show", run_id, "--workers", WORKERS),
        asyncio.to_thread(agentflow, dep, "verify", run_id, env={"AGENTFLOW_WORKERS": WORKERS}),
        asyncio.to_thread(agentflow, dep, "events", run_id, "--workers", WORKERS),
    )
    # Then each reads the deployment's store under its key ring
    for ran in (listed, shown, verified, events):
        assert ran.code == 0, ran.output
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith(run_id)]
    assert row.split()[1:3] == ["tickets", "done"]
    assert shown.stdout.startswith(f"run {run_id}   flow tickets") and "(by w1@" not in shown.stdout
    assert verified.stdout.startswith("ok: 1 run(s)")
    # And the events, with the deployment's cursors (Redis stream ids), end with the run's end
    lines = events.stdout.splitlines()
    assert all("-" in line.split()[0] for line in lines)
    started = [line.split()[4] for line in lines if line.split()[3] == "tool.started"]
    assert started == ["tool=hold_seats", "tool=charge_card", "tool=email_tickets"]
    assert lines[-1].split()[3:5] == ["run.finished", "status=done"]


# -- without a deployment ----------------------------------------------------------------------------


def test_the_cli_imports_celery_only_with_workers() -> None:
    # The celery extra is optional: the CLI's commands load without it until --workers is given
    code = "import sys, agentflow.cli._group; assert 'celery' not in sys.modules, sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workers", "workers.celery_app"], "write it as package.module:attribute"),
        (["--workers", "no_such_module:tasks"], "cannot import 'no_such_module'"),
        (["--workers", "agentflow.demo.tickets:app"], "is FlowApp, not the AgentflowTasks register_tasks returned"),
    ],
)
def test_a_bad_workers_path_is_one_line(args: list[str], says: str) -> None:
    result = CliRunner().invoke(cli, ["recover", "r-1", *args], env={"AGENTFLOW_STORE": None})
    assert result.exit_code == 2, result.output
    assert says in one_line_error(result)


def test_the_demos_workers_are_acted_through_only_with_allow_demo_key(redis_url: str) -> None:
    # Given the demo's deployment (signed with the demo's public key), on a prefix nobody uses
    env = {"AGENTFLOW_REDIS_URL": redis_url, "AGENTFLOW_DEMO_PREFIX": "cli-test-demo", "AGENTFLOW_STORE": None}
    args = ["recover", "nope", "--workers", "agentflow.demo.celery_app:tasks"]
    # When a command acts through it without --allow-demo-key, Then it stops in one line that says why
    refused = CliRunner().invoke(cli, args, env={**env, "AGENTFLOW_ALLOW_DEMO_KEY": None})
    assert refused.exit_code == 2
    assert "signs with the demo's public key" in one_line_error(refused) and "--allow-demo-key" in refused.stderr
    # And with the flag it acts (here: it looks the run up, and there is none)
    allowed = CliRunner().invoke(cli, [*args, "--allow-demo-key"], env=env)
    assert allowed.exit_code == 2 and "no run 'nope' in this store" in one_line_error(allowed)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workers", "w:t", "--store", "sqlite:///x.db"], "--store acts in this process, --workers through"),
        (["--workers", "w:t", "--app", "runs_kit:app"], "--app acts in this process, --workers through"),
        (["--store", "sqlite:///x.db", "--app", "runs_kit:app", "--no-wait"], "--no-wait and --timeout go with"),
        (["--app", "runs_kit:app"], "give --store URL (or $AGENTFLOW_STORE) to act here, or --workers"),
        (["--store", "sqlite:///x.db"], "give --app MODULE:ATTR"),
    ],
)
def test_one_mode_or_the_other(args: list[str], says: str) -> None:
    result = CliRunner().invoke(cli, ["retry", "r-1", *args], env={"AGENTFLOW_STORE": None, "AGENTFLOW_WORKERS": None})
    assert result.exit_code == 2, result.output
    assert says in result.stderr
