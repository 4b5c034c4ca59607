"""Durable pydantic-ai agents: `DurableAgent(agent, name=..., idempotent={...})` (see README.md).

Needs the ``pydantic-ai`` extra (``pip install 'agentflow[pydantic-ai]'``).
"""

from agentflow.integrations.pydantic_ai._deps import AgentInput
from agentflow.integrations.pydantic_ai._driver import AgentResult
from agentflow.integrations.pydantic_ai.agent import DurableAgent
from agentflow.integrations.pydantic_ai.runner import AgentRunner

__all__ = ["AgentInput", "AgentResult", "AgentRunner", "DurableAgent"]
