"""The support agent: a pydantic-ai agent that looks an order up and charges it, made durable.

The model is a stand-in (pydantic-ai's `FunctionModel`: no network, no API key): on the prompt
"Charge order A1" it looks the order up and charges it, then answers. ``charge`` is the
non-idempotent tool: run twice, it charges twice. Every charge is a line in the ledger file
``FLEET_LEDGER`` names (the card's statement, which the operator checks before deciding).

``FLEET_CRASH_ON`` (an order id) stands in for a crash: the worker charging that order stops
right after the charge, before anyone learns its result, and waits there to be killed. The
marker file ``FLEET_CRASH_MARK`` tells the driver which process to kill; it is made once, so
the crash happens once.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentflow.integrations.pydantic_ai import DurableAgent

PRICES = {"A1": 90, "B2": 35}


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A stand-in for an LLM: charge the order the prompt names, then say what was done."""
    parts = [part for message in messages for part in message.parts]
    returns = [part for part in parts if isinstance(part, ToolReturnPart)]
    if not returns:
        prompt = next(part.content for part in parts if isinstance(part, UserPromptPart))
        order = re.findall(r"order (\w+)", str(prompt))[0]
        return ModelResponse(parts=[ToolCallPart("charge", {"order": order, "amount": PRICES[order]})])
    return ModelResponse(parts=[TextPart(f"Done: {returns[-1].content}.")])


agent = Agent(FunctionModel(model), name="support")


@agent.tool_plain
def charge(order: str, amount: int) -> str:
    """Charge the customer's card for the order (not idempotent: a second call charges again)."""
    with Path(os.environ["FLEET_LEDGER"]).open("a") as ledger:
        ledger.write(json.dumps({"order": order, "amount": amount, "pid": os.getpid()}) + "\n")
    if order == os.environ.get("FLEET_CRASH_ON"):
        _crash_here()
    return f"charged {amount} EUR for {order}"


def _crash_here() -> None:
    """Stand for a worker dying after the charge: say which process to kill (once), and wait for it."""
    mark = os.environ["FLEET_CRASH_MARK"]
    try:
        fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # crashed once already
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    while True:
        time.sleep(1)  # the driver SIGKILLs this worker now


#: Durable on the workers: each model request and each round of tools is a superstep.
durable = DurableAgent(agent)
