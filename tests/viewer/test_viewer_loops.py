"""A tool loop on the run page: the viewer acts on it as on a flow run, with the app's loop of that name.

The viewer's operator (`agentflow.operate`) picks the run's operations by its kind, so a paused
loop is approved from its page like a paused flow run; what a loop cannot take (fork, retry) is
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


def test_a_tool_loop_is_not_offered_a_fork_and_the_page_says_why(loop_db: Path) -> None:
    with client_for(make_app(loop_db, flows=app)) as client:
        page = client.get("/runs/chat-1").text
        # And a hand-made post is refused with the same reason, the loop untouched
        forked = client.post("/runs/chat-1/fork", data={"csrf": "0" * 64, "at_step": "0"})
    assert "/runs/chat-1/fork" not in page and "only flow runs can be forked" in page
    assert forked.status_code in (400, 403, 409)
    assert report_of(loop_db, "chat-1").status == "paused" and runs_kit.REFUNDS == []


def test_a_viewer_whose_app_lacks_the_loop_names_what_it_has(loop_db: Path) -> None:
    with client_for(make_app(loop_db, flows=runs_kit.app)) as client:
        page = client.get("/runs/chat-1").text
    assert "unknown tool loop &#39;support&#39; (this app has: none)" in page
