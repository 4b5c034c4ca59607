"""Flow versions: new runs start on the newest, a stored run continues on its own, and `migrate` moves one.

The rules that touch storage run on every store set-up (the ``workers`` fixture); the
rules of the builder and of `FlowVersions` need no store.
"""

from __future__ import annotations

from typing import Any

import pytest
from _kit.faults import body
from _kit.tickets import KEY, ORDER, REFUNDS, TICKETS, Crash, Order, Refund, amount_args, tickets_flow
from _kit.workers import faulty
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, RunStatus
from agentflow._errors import CheckpointConflict, FlowError, VersionNotDeployed
from agentflow._run_types import version_of
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer
from agentflow.flow._versions import FlowVersions


class RefundV2(BaseModel):
    """Version 2's state: the refund now names its currency."""

    amount: int
    currency: str
    outcome: str = ""
    after: str = ""


#: Version 2 of the refunds flow: every refund is noted, then notified (no apology branch).
REFUNDS_V2 = (
    Flow("refunds", state=RefundV2, version="2")
    .node("refund", Call("refund", args=amount_args, into="outcome", on_deny="denied"))
    .node("notify", Call("notify", args=amount_args, into="after"))
    .edge("refund", "notify")
    .end("notify")
)
BOTH: FlowVersions[Any] = FlowVersions([REFUNDS, REFUNDS_V2])

#: Version 2 of the tickets flow: a receipt after sending.
TICKETS_V2 = tickets_flow(with_receipt=True, version="2")


def with_currency(old: dict[str, Any]) -> dict[str, Any]:
    return {**old, "currency": "EUR"}


# -- the builder and the set of versions ---------------------------------------------------


def test_a_flow_is_on_version_1_unless_told_and_a_version_must_be_a_short_plain_string():
    assert Flow("f", state=Order).version == "1"
    assert Flow("f", state=Order, version="2024-06.b").version == "2024-06.b"
    for bad in ("", " 2", "2/3", "-2", "x" * 41):
        with pytest.raises(FlowError, match="is not a version"):
            Flow("f", state=Order, version=bad)
    with pytest.raises(FlowError, match="is not a version"):
        Flow("f", state=Order, version=2)  # type: ignore[arg-type]


def test_the_newest_version_compares_numbers_as_numbers_whatever_the_order_given():
    flows = [tickets_flow(version=v) for v in ("10", "9", "1.10", "1.9")]
    versions: FlowVersions[Any] = FlowVersions(flows)
    assert versions.newest.version == "10"
    assert versions.versions == ["1.9", "1.10", "9", "10"]
    assert FlowVersions([TICKETS_V2, TICKETS]).newest is TICKETS_V2


def test_versions_of_one_flow_must_share_its_name_and_differ():
    with pytest.raises(FlowError, match="given twice"):
        FlowVersions([TICKETS, tickets_flow()])
    with pytest.raises(FlowError, match="not versions of one flow"):
        FlowVersions([TICKETS, tickets_flow(name="other", version="2")])


def test_an_app_holds_several_versions_of_a_flow_and_names_the_newest(workers):
    app = FlowApp(workers.tickets.registry, [TICKETS_V2, TICKETS, REFUNDS])
    assert app.flow("tickets") is TICKETS_V2 and app.flow("tickets", "1") is TICKETS
    assert app.flow_versions("tickets").versions == ["1", "2"]
    assert app.has_version("tickets", "1") and not app.has_version("tickets", "3")
    with pytest.raises(FlowError, match="no version '3'"):
        app.flow("tickets", "3")
    with pytest.raises(FlowError, match="given twice"):
        FlowApp(workers.tickets.registry, [TICKETS, tickets_flow()])


def test_a_checkpoint_saved_before_versions_existed_is_on_version_1():
    assert version_of({}) == "1"
    assert version_of({"version": "7"}) == "7"


# -- running on versions -------------------------------------------------------------------


async def test_a_new_run_starts_on_the_newest_and_a_stored_run_continues_on_its_own(workers):
    # Given a refund paused for approval on version 1
    old = await workers.runner().run(REFUNDS, Refund(amount=500), run_id="refund-1")
    assert old.status == RunStatus.PAUSED and old.version == "1"
    # When a runner with both versions starts a new run and resumes the old one
    new = await workers.runner().run(BOTH, {"amount": 50, "currency": "USD"}, run_id="refund-2")
    resumed = await workers.runner().resume(BOTH, "refund-1", approve=False)
    # Then the new run ran on version 2, and the old one finished on version 1 (its apology branch)
    assert new.version == "2" and new.status == RunStatus.DONE and isinstance(new.state, RefundV2)
    assert resumed.version == "1" and resumed.status == RunStatus.DONE
    assert isinstance(resumed.state, Refund) and resumed.state.outcome == "denied"
    assert workers.ran("refund-1") == {"apologize": 1}
    assert body((await workers.history("refund-1"))[-1])["version"] == "1"
    assert (await read_run(workers.raw, Sealer(KEY), "refund-2")).version == "2"


async def test_a_run_whose_version_is_not_deployed_is_left_exactly_as_it_was(workers):
    # Given a refund paused on version 1
    await workers.runner().run(REFUNDS, Refund(amount=500), run_id="refund-1")
    before = await workers.history("refund-1")
    # When a runner that has only version 2 is asked to resume it
    with pytest.raises(VersionNotDeployed) as err:
        await workers.runner().resume(REFUNDS_V2, "refund-1", approve=True)
    # Then it says what the run needs, and nothing was written, run or left held
    assert (err.value.run_id, err.value.flow, err.value.version, err.value.deployed) == (
        "refund-1",
        "refunds",
        "1",
        ["2"],
    )
    assert "needs migration" in str(err.value) and "agentflow migrate refund-1" in str(err.value)
    assert await workers.history("refund-1") == before
    assert workers.ran("refund-1") == {}
    assert (await read_run(workers.raw, Sealer(KEY), "refund-1")).lease is None


async def test_recover_all_lists_a_stranded_run_of_another_version_and_recovers_the_rest(workers):
    # Given two stranded ticket runs, one on version 1 and one on version 2
    for flow, run_id in ((TICKETS, "order-1"), (TICKETS_V2, "order-2")):
        runner = workers.runner()
        faulty(runner).crash("save", step=2)
        with pytest.raises(Crash):
            await runner.run(flow, ORDER, run_id=run_id)
    # When a worker with version 2 only recovers every unfinished run
    outcomes = await workers.runner().recover_all(TICKETS_V2)
    # Then the version 1 run is reported as not deployed (and untouched); the other finished
    assert isinstance(outcomes["order-1"], VersionNotDeployed)
    assert outcomes["order-2"].status == RunStatus.DONE
    assert "order-1" in await workers.raw.list_unfinished("tickets")


# -- migrate -------------------------------------------------------------------------------


async def test_migrate_moves_a_paused_run_onto_the_new_version_signed_and_audited(workers):
    # Given a refund paused for approval on version 1, whose version is then retired
    await workers.runner().run(REFUNDS, Refund(amount=500), run_id="refund-1")
    # When an operator migrates it to version 2, mapping the state
    moved = await workers.runner().migrate(BOTH, "refund-1", to_version="2", state=with_currency, operator="alice")
    # Then it asks for the approval again on version 2, and finishes there once approved
    assert moved.status == RunStatus.PAUSED and moved.version == "2"
    assert isinstance(moved.state, RefundV2) and moved.state.currency == "EUR"
    done = await workers.runner().resume(REFUNDS_V2, "refund-1", approve=True)
    assert done.status == RunStatus.DONE and done.version == "2"
    assert workers.ran("refund-1") == {"refund": 1, "notify": 1}
    # And the move is a signed claim naming the operator and both versions
    claims = [body(row) for row in await workers.history("refund-1") if body(row).get("claim") == "migrate"]
    assert len(claims) == 1
    assert claims[0]["operator"] == "alice" and claims[0]["migrated"] == {"from": "1", "to": "2", "at": None}
    assert [e.data["to"] for e in workers.named("run.migrated")] == ["2"]


async def test_migrate_goes_on_from_the_node_it_is_told(workers):
    # Given a ticket run stopped between supersteps on version 1 (seats held)
    await workers.runner().run(TICKETS, ORDER, run_id="order-1", max_supersteps=1)
    # When it is migrated to version 2, going on from "send" (the operator settled payment elsewhere)
    result = await workers.runner().migrate(
        FlowVersions([TICKETS, TICKETS_V2]), "order-1", at="send", state=lambda s: {**s, "paid": "by phone"}
    )
    # Then version 2 ran send and its receipt; pay never ran
    assert result.status == RunStatus.DONE and result.version == "2"
    assert result.state.paid == "by phone" and result.state.sent and result.state.looked
    assert workers.ran("order-1") == {"hold_seats": 2, "email_tickets": 1}


async def test_migrate_refuses_a_step_with_logged_calls_and_writes_nothing(workers):
    # Given a run whose worker died after its pay call finished, before the checkpoint
    runner = workers.runner()
    faulty(runner).crash("save", step=2)
    with pytest.raises(Crash):
        await runner.run(TICKETS, ORDER, run_id="order-1")
    before = await workers.history("order-1")
    # When an operator tries to migrate it
    with pytest.raises(FlowError, match="finished or in doubt in the step"):
        await workers.runner().migrate(TICKETS_V2, "order-1")
    # Then nothing was written: the run is recovered on its own version, the card charged once
    assert await workers.history("order-1") == before
    assert (await workers.runner().recover(TICKETS, "order-1")).status == RunStatus.DONE
    assert workers.ran("order-1")["charge_card"] == 1


async def test_migrate_refuses_what_does_not_fit_and_writes_nothing(workers):
    await workers.runner().run(REFUNDS, Refund(amount=500), run_id="refund-1")
    before = await workers.history("refund-1")
    runner = workers.runner()
    with pytest.raises(FlowError, match="does not fit RefundV2"):
        await runner.migrate(BOTH, "refund-1")  # no currency
    with pytest.raises(FlowError, match="the state function raised KeyError"):
        await runner.migrate(BOTH, "refund-1", state=lambda s: {**s, "currency": s["nope"]})
    with pytest.raises(FlowError, match="has no node 'apologize'"):
        await runner.migrate(BOTH, "refund-1", state=with_currency, at="apologize")
    with pytest.raises(FlowError, match="no version '3'"):
        await runner.migrate(BOTH, "refund-1", to_version="3")
    assert await workers.history("refund-1") == before
    # A finished run is not migrated
    await workers.runner().run(TICKETS, ORDER, run_id="order-1")
    with pytest.raises(CheckpointConflict, match="only an unfinished run can be migrated"):
        await workers.runner().migrate(TICKETS_V2, "order-1")


async def test_a_fork_starts_on_the_version_of_the_checkpoint_it_forks(workers):
    await workers.runner().run(TICKETS, ORDER, run_id="order-1")
    forked = await workers.runner().fork(
        FlowVersions([TICKETS, TICKETS_V2]), "order-1", at_step=1, new_run_id="order-1b"
    )
    assert forked.version == "1" and forked.status == RunStatus.DONE and not forked.state.looked
