"""The flows and tools these workers run.

``AGENTFLOW_APP`` names your own `FlowApp` (``package.module:attribute``; the demo sets
``agentflow.demo.tickets:app``): register your tools on a `Registry`, build your flows,
and bundle them with ``FlowApp(registry, [flow, ...])``.
"""

from agentflow import FlowApp
from agentflow._app import load_app


def load_flow_app(path: str) -> FlowApp:
    """Import the app the settings name.

    Raises:
        SystemExit: it cannot be imported (the message says why).
    """
    try:
        return load_app(path)
    except ValueError as exc:
        raise SystemExit(f"AGENTFLOW_APP: {exc}") from None
