"""Serve the viewer with uvicorn."""

from __future__ import annotations

import uvicorn

from agentflow.viewer._app import ViewerSettings, create_app


def serve(settings: ViewerSettings, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the viewer on `host`:`port` until the process is interrupted (loopback by default)."""
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning", server_header=False)
