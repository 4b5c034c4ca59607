"""A run's identity: user, thread and principal are signed into each checkpoint and checked on recovery.

Every test runs on every store set-up (`_kit.stores`).
"""

from __future__ import annotations

import dataclasses

import pytest
from _kit.faults import body
from _kit.tickets import AUDITED, ORDER, REFUNDS, TICKETS, Crash, Order, Refund
from _kit.workers import Workers, faulty

from agentflow import Flow, RunContext
from agentflow.errors import IdentityMismatch
from agentflow.exec.checkpoints import CheckpointStoreCorrupt
from agentflow.exec.seal import canonical
from agentflow.flow import RunResult

ALICE = RunContext(user="alice", thread="thread-1")
PRINCIPAL = "tok-3f9a-very-secret-principal"
ALICE_WITH_TOKEN = RunContext(user="alice", thread="thread-1", principal=PRINCIPAL)


async def crashed(
    workers: Workers, run_id: str, ctx: RunContext | None, *, flow: Flow[Order] = TICKETS, before_save: int = 2
) -> None:
    first = workers.runner()
    faulty(first).crash("save", step=before_save)
    with pytest.raises(Crash):
        await first.run(flow, ORDER, run_id=run_id, ctx=ctx)


async def refused_identity(workers: Workers, run_id: str, ctx: RunContext | None) -> IdentityMismatch:
    """Recover `run_id` with `ctx`: it must fail with IdentityMismatch, run nothing and claim nothing."""
    before, steps = workers.ran(), len(await workers.history(run_id))
    with pytest.raises(IdentityMismatch) as caught:
        await workers.runner().recover(TICKETS, run_id, ctx=ctx)
    assert workers.ran() == before
    assert len(await workers.history(run_id)) == steps
    return caught.value


async def test_user_and_thread_are_signed_into_each_checkpoint(workers):
    # Given a crashed run for alice in thread-1
    await crashed(workers, "order-1", ALICE)

    # Then every checkpoint carries her identity
    history = await workers.history("order-1")
    assert [body(c)["identity"] for c in history] == [{"user": "alice", "thread": "thread-1", "principal": None}] * 2

    # When someone rewrites the latest checkpoint's identity to mallory's
    latest = history[-1]
    forged = body(latest)
    forged["identity"]["user"] = "mallory"
    await workers.rows.put_checkpoint(latest, dataclasses.replace(latest, payload=canonical(forged)))

    # Then mallory cannot recover the run: the checkpoint fails its check, and nothing runs
    before = workers.ran()
    with pytest.raises(CheckpointStoreCorrupt):
        await workers.runner().recover(TICKETS, "order-1", ctx=RunContext(user="mallory", thread="thread-1"))
    assert workers.ran() == before


async def test_principal_is_never_stored_in_clear(workers):
    # Given runs that act for a principal: one crashed and recovered, one paused and resumed
    await crashed(workers, "order-1", ALICE_WITH_TOKEN)
    await workers.runner().recover(TICKETS, "order-1", ctx=ALICE_WITH_TOKEN)
    paused = await workers.runner().run(REFUNDS, Refund(amount=500), run_id="refund-1", ctx=ALICE_WITH_TOKEN)
    assert paused.status == "paused"
    done = await workers.runner().resume(REFUNDS, "refund-1", approve=True, ctx=ALICE_WITH_TOKEN)
    assert done.status == "done"

    # When every byte the store holds is searched (checkpoints and call records)
    stored = await workers.rows.stored_bytes()
    assert b"Hamlet" in stored and b"alice" in stored  # the search does see what is stored

    # Then the principal is not there, only a proof of it is
    assert PRINCIPAL.encode() not in stored
    assert PRINCIPAL.encode("utf-16-le") not in stored
    for run_id in ("order-1", "refund-1"):
        proofs = {body(c)["identity"]["principal"] for c in await workers.history(run_id)}
        assert len(proofs) == 1 and None not in proofs


async def test_recover_without_ctx_restores_user_and_thread(workers):
    # Given a run for alice in thread-1 that crashed after its first audited call
    await crashed(workers, "audit-1", ALICE, flow=AUDITED, before_save=1)
    assert [(c.user, c.thread) for c in workers.tickets.seen_ctx] == [("alice", "thread-1")]

    # When a worker recovers it without a ctx
    result = await workers.runner().recover(AUDITED, "audit-1")

    # Then the next call's approval policy is asked with alice's user and thread (and no principal)
    assert result.status == "done"
    assert len(workers.tickets.seen_ctx) == 2
    restored = workers.tickets.seen_ctx[-1]
    assert restored is not None
    assert (restored.user, restored.thread, restored.principal) == ("alice", "thread-1", None)


@pytest.mark.parametrize(
    "ctx",
    [
        RunContext(user="mallory", thread="thread-1"),
        RunContext(user="alice", thread="thread-2"),
        RunContext(user="mallory"),
        RunContext(thread="thread-2"),
    ],
    ids=["other-user", "other-thread", "other-user-only", "other-thread-only"],
)
async def test_ctx_for_another_user_or_thread_is_refused(workers, ctx):
    # Given a crashed run for alice in thread-1
    await crashed(workers, "order-1", ALICE)

    # When a worker recovers it for someone else
    error = await refused_identity(workers, "order-1", ctx)

    # Then IdentityMismatch, which is a PermissionError (and nothing ran)
    assert isinstance(error, PermissionError)


async def test_run_with_a_principal_needs_its_principal_back(workers):
    # Given a crashed run that acts for a principal
    await crashed(workers, "order-1", ALICE_WITH_TOKEN)

    # When a worker recovers it without a ctx, or with alice's user and thread only, or a wrong principal
    # Then each is refused and nothing runs
    await refused_identity(workers, "order-1", None)
    await refused_identity(workers, "order-1", ALICE)
    await refused_identity(workers, "order-1", dataclasses.replace(ALICE_WITH_TOKEN, principal="tok-guessed"))

    # When it is recovered with the principal (user and thread may be left out)
    result = await workers.runner().recover(TICKETS, "order-1", ctx=RunContext(principal=PRINCIPAL))

    # Then it goes on and finishes
    assert result.status == "done"
    assert workers.ran() == {"hold_seats": 1, "charge_card": 1, "email_tickets": 1}


async def test_principal_cannot_be_added_on_recovery(workers):
    # Given a crashed run started without a principal
    await crashed(workers, "order-1", ALICE)

    # When a worker recovers it with a principal
    # Then it is refused and nothing runs
    await refused_identity(workers, "order-1", ALICE_WITH_TOKEN)


async def test_recover_all_reports_runs_that_need_their_principal(workers):
    # Given a crashed run acting for a principal, and a crashed run without one
    await crashed(workers, "with-token", ALICE_WITH_TOKEN)
    await crashed(workers, "plain", ALICE)
    before = workers.ran()

    # When a worker starting up recovers all runs of the flow
    out = await workers.runner().recover_all(TICKETS)

    # Then the run with a principal is reported as IdentityMismatch (not run), the other finishes
    assert set(out) == {"with-token", "plain"}
    assert isinstance(out["with-token"], IdentityMismatch)
    assert isinstance(out["plain"], RunResult) and out["plain"].status == "done"
    assert workers.ran() - before == {"email_tickets": 1}
    assert (await workers.history("with-token"))[-1].step == 1
