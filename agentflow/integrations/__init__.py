"""Durable runs for agents written in other frameworks (`agentflow.integrations.pydantic_ai`)."""
