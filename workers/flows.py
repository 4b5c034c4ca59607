"""The flows and tools these workers run. Add yours here (or point WORKERS at your module).

A deployment registers its own tools on a `Registry`, builds its flows, and bundles them in
a `FlowApp`; the ticket flow of the demo is the example.
"""

from agentflow.demo.tickets import app

__all__ = ["app"]
