"""A tool loop on the run page: the viewer acts on it as on a flow run, with the app's loop of that name.

The viewer's transport (`agentflow.runs.Runs`) picks the run's protocol by its kind, so a paused
loop is approved and forked from its page like a flow run; what a loop cannot take (retry) is
not offered, and the page says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import runs_kit
from ops_kit import act, report_of
from viewer_kit import client_for, make_app

from agentflow import FlowApp, LoopSpec
from agentflow.exec import LoopRunner
from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.models import Message, ToolCall


class RefundModel:
    """Asks for the refund of order A1, and answers once the refund's result is in the conversation."""

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        if any(m.role == "tool" for m in messages):
            return Message.assistant("Refunded A1.")
        return Message.assistant(tool_calls=[ToolCall(id="c0", name="refund", arguments={"order": "A1", "amount": 5})])


#: The runs kit's flows and tools, and the tool loop ``support`` on the same refund tool.
app = FlowApp(runs_kit.registry, [runs_kit.refunds, runs_kit.shipping],
              loops={"support": LoopSpec(model_factory=RefundModel, registry=runs_kit.registry)})  # fmt: skip


@pytest.fixture
def loop_db(db: Path) -> Path:
    """The kit's runs and ``chat-1``, a support loop paused for the refund's approval."""

    async def add() -> None:
        async with SQLiteCheckpointStore(db) as store:
            loop = LoopRunner(RefundModel(), runs_kit.registry, checkpoints=store, checkpoint_key=runs_kit.KEY,
                              name="support")  # fmt: skip
            await loop.run([Message.user("Refund A1")], run_id="chat-1")

    runs_kit.in_thread(add)
    return db


def test_a_paused_tool_loop_is_approved_from_its_page_and_ends(loop_db: Path) -> None:
    with client_for(make_app(loop_db, flows=app)) as client:
        # When Approve is posted on the paused loop's page
        answer = act(client, "chat-1", "resume", decision="approve")
    # Then the refund ran once, in the viewer's process, and the loop answered
    assert answer.status_code == 303 and answer.headers["location"] == "/runs/chat-1?done=approved"
    assert runs_kit.REFUNDS == ["A1"]
    assert report_of(loop_db, "chat-1").status == "done"


def test_a_tool_loop_is_forked_from_its_page_like_a_flow_run(loop_db: Path) -> None:
    with client_for(make_app(loop_db, flows=app)) as client:
        # Given the loop's page, which names its kind and name as a flow run's names its flow
        page = client.get("/runs/chat-1").text
        assert "<dt>Kind</dt><dd>tool loop</dd>" in page and "<dt>Name</dt><dd>support</dd>" in page
        # When Fork is posted on the paused loop's page, from the reply that asks for the refund
        answer = act(client, "chat-1", "fork", at_step="1")
    # Then a new loop starts from that reply, here: it asks for the refund's approval again, the loop untouched
    assert answer.status_code == 303 and answer.headers["location"].endswith("?done=forked")
    new_id = answer.headers["location"].removeprefix("/runs/").removesuffix("?done=forked")
    forked = report_of(loop_db, new_id)
    assert forked.status == "paused" and [p["tool"] for p in forked.pending] == ["refund"]
    assert forked.forked_from is not None and (forked.forked_from.run_id, forked.forked_from.step) == ("chat-1", 1)
    assert report_of(loop_db, "chat-1").status == "paused" and runs_kit.REFUNDS == []


def test_a_patch_on_a_tool_loops_fork_is_refused_with_the_reason(loop_db: Path) -> None:
    with client_for(make_app(loop_db, flows=app)) as client:
        answer = act(client, "chat-1", "fork", at_step="1", patch='{"amount": 9}')
    assert answer.status_code in (400, 409) and "fork starts from the checkpoint&#39;s messages" in answer.text


def test_a_viewer_whose_app_lacks_the_loop_names_what_it_has(loop_db: Path) -> None:
    with client_for(make_app(loop_db, flows=runs_kit.app)) as client:
        page = client.get("/runs/chat-1").text
    assert "unknown tool loop &#39;support&#39; (this app has: none)" in page
