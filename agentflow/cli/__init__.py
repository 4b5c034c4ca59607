"""The ``agentflow`` command: list, show and verify runs; act on them (here or on the workers); the viewer."""
