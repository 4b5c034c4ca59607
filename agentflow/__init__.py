"""agentflow: durable execution for agent work."""
