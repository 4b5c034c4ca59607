"""A run of each kind parked on a charge in doubt, and what its view must say whatever the kind.

The three kinds charge a card in a tool that is not idempotent:
- the flow ``tickets`` (`_kit.tickets.TICKETS`): ``charge_card(show, seats=2)``;
- the tool loop ``charges`` (`ChargeModel` over the ticket tools): ``charge_card(show, seats=1)``;
- the agent ``orders`` (`_kit.agents`): ``charge(order="A1", amount=90)`` (logged as its ``args``).

A worker that dies inside the charge leaves the call in doubt; the next worker parks the run
for a decision. `PARKED` says, per kind, what each one's view names, and `check_parked` holds
a `RunView` to it: the same fields, the same kind of wait, for every kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from _kit.agents import EXPECTED, charge_result
from agentflow.errors import RunNotDone
from agentflow.models import Message, ToolCall


class ChargeModel:
    """A stateless model: charge one seat of the show the user names, then report the charge."""

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        results = [m.content for m in messages if m.role == "tool"]
        if not results:
            charge = ToolCall(id="k1", name="charge_card", arguments={"show": messages[0].content, "seats": 1})
            return Message.assistant(tool_calls=[charge])
        return Message.assistant(f"answer: {results[-1]}")


@dataclass(frozen=True)
class Parked:
    """What a parked run of one kind names, and what it ends with once the charge is said to have happened."""

    kind: str
    """The view's kind: ``flow``, ``loop`` or ``agent``."""
    name: str
    """The flow's, the loop's or the agent's name."""
    tool: str
    """The charge tool its call in doubt calls."""
    args: dict[str, Any]
    """The charge's arguments, as logged."""
    charged: str
    """What the charge returned (what an operator who checked the card says it returned)."""

    def output(self, result: Any) -> Any:
        """What the run's `result` must be once done."""
        if self.kind == "flow":
            return result.paid == self.charged and result.sent == f"mailed {self.args['show']}"
        if self.kind == "loop":
            return result == f"answer: {self.charged}"
        return result == EXPECTED


#: Each kind's parked run, by kind (the show is ``parked``).
PARKED = {
    "flow": Parked("flow", "tickets", "charge_card", {"show": "parked", "seats": 2}, "charged 80 for parked"),
    "loop": Parked("loop", "charges", "charge_card", {"show": "parked", "seats": 1}, "charged 40 for parked"),
    "agent": Parked("agent", "orders", "charge", {"args": {"order": "A1", "amount": 90}}, charge_result("A1", 90)),
}


def check_parked(view: Any, parked: Parked) -> str:
    """Hold a parked run's view to what every kind's must say; return the id of its call in doubt."""
    assert (view.kind, view.name, view.status) == (parked.kind, parked.name, "running"), view
    assert view.settled and view.running_on is None
    waiting = view.waiting
    assert waiting is not None and waiting.what == "decision", view
    [call] = waiting.calls
    assert (call.tool, call.args) == (parked.tool, parked.args), call
    assert [c.call_id for c in view.in_doubt] == [call.call_id] and call.call_id
    assert view.waiting_for_decision == f"{parked.tool}: {call.why}"
    assert view.output is None
    return str(call.call_id)


async def check_no_result_yet(reader: Any, run_id: str, parked: Parked) -> None:
    """A parked run's `result` is refused with what it waits for."""
    with pytest.raises(RunNotDone, match=f"it is running, waiting for a decision on calls in doubt: {parked.tool}"):
        await reader.result(run_id)
