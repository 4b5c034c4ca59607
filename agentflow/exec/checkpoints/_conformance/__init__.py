"""The conformance checks, one module per part of the store port; `agentflow.exec.checkpoints.conformance` runs them."""
