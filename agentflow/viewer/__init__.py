"""The run viewer: a small web page over a checkpoint store (Starlette, Jinja2, uvicorn)."""

from agentflow.viewer._app import ViewerSettings, create_app
from agentflow.viewer._serve import serve

__all__ = ["ViewerSettings", "create_app", "serve"]
