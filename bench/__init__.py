"""agentflow's benchmark suite: ``python -m bench`` (see `bench._suite` for the list and how to add one)."""
