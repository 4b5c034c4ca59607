"""The ``agentflow`` command: list, show, verify, recover and resume stored runs; serve the viewer."""
