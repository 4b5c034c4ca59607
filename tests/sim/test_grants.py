"""The simulation's rule that a call that may have happened is started again only on a signed grant (`_grants`)."""

from __future__ import annotations

from agentflow.sim._grants import Grants

RUN = "r0-shop"


def started(call_id: str = "1/pay/1/x", *, idempotent: bool = False) -> dict[str, object]:
    return {"call_id": call_id, "tool": "charge", "idempotent": idempotent}


def test_a_call_started_again_without_a_grant_breaks_the_rule_whether_or_not_its_effect_happened() -> None:
    # Given a non-idempotent call started once (its worker then died: no effect, no done)
    grants = Grants()
    assert grants.call(RUN, "started", started()) is None
    # When a recovery starts it again with no decision
    broken = grants.call(RUN, "started", started())
    # Then the second started is the broken rule
    assert broken is not None and "started again with no signed grant" in broken


def test_a_rerun_decision_grants_exactly_one_more_start() -> None:
    grants = Grants()
    grants.call(RUN, "started", started())
    grants.checkpoint(RUN, {"claim": "decide", "rerun": ["1/pay/1/x"]})
    assert grants.call(RUN, "started", started()) is None
    assert grants.call(RUN, "started", started()) is not None


def test_a_retry_grants_a_rerun_of_a_call_that_stood_failed_without_a_done() -> None:
    # Given a call started, then failed by an operator's "did not happen"
    grants = Grants()
    grants.call(RUN, "started", started())
    grants.call(RUN, "failed", {"call_id": "1/pay/1/x"})
    # When the run is retried
    grants.checkpoint(RUN, {"claim": "retry"})
    # Then the call may start once more
    assert grants.call(RUN, "started", started()) is None


def test_a_retry_grants_nothing_to_a_call_whose_own_done_is_stored() -> None:
    # Given a call whose late done came after the operator's "did not happen" (the done is its last word)
    grants = Grants()
    grants.call(RUN, "started", started())
    grants.call(RUN, "done", {"call_id": "1/pay/1/x"})
    grants.call(RUN, "failed", {"call_id": "1/pay/1/x"})
    grants.checkpoint(RUN, {"claim": "retry"})
    # Then a retry starting it again breaks the rule
    assert grants.call(RUN, "started", started()) is not None


def test_an_idempotent_call_reruns_freely() -> None:
    grants = Grants()
    for _ in range(3):
        assert grants.call(RUN, "started", started("1/look/1/y", idempotent=True)) is None


def test_a_start_under_a_deploy_that_declares_the_tool_idempotent_lets_the_next_start_go_free() -> None:
    # Given a call started not idempotent, rerun on a decision by a worker whose deploy declares it idempotent
    grants = Grants()
    grants.call(RUN, "started", started())
    grants.checkpoint(RUN, {"claim": "decision", "rerun": ["1/pay/1/x"]})
    assert grants.call(RUN, "started", started(idempotent=True)) is None
    # Then its next start needs no grant (the ledger counts an effect by the flags its start had)
    assert grants.call(RUN, "started", started()) is None
    # And the one after that, following a start signed not idempotent, does again
    assert grants.call(RUN, "started", started()) is not None
