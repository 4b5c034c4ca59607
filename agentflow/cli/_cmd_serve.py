"""``agentflow viewer`` (serve the run viewer) and ``agentflow demo`` (tell the crash story)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from agentflow._display import redact
from agentflow.cli import _errors
from agentflow.cli._apps import import_app
from agentflow.cli._target import open_target, store_options

#: Hosts that only this machine can reach.
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _token(token_env: str | None) -> str | None:
    if token_env is None:
        return None
    token = os.environ.get(token_env, "").strip()
    if len(token) < 16:
        raise _errors.CliError(f"--token-env {token_env}: ${token_env} must hold a token of 16 or more characters")
    return token


@click.command("viewer")
@store_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option("--token-env", metavar="NAME", help="Environment variable holding a token that approving requires.")
@click.option("--app", "app_path", metavar="MODULE:ATTR", help="The FlowApp, to approve or deny paused runs.")
def viewer(store_url: str, key_env: str, host: str, port: int, token_env: str | None, app_path: str | None) -> None:
    """Serve the run viewer (a small web page over the store) until interrupted."""
    try:
        from agentflow.viewer import ViewerSettings, serve
    except ImportError as exc:
        raise _errors.CliError(
            f"the viewer needs the 'viewer' extra: pip install 'agentflow[viewer]' ({exc})"
        ) from None
    token = _token(token_env)
    flows = import_app(app_path) if app_path else None
    target = open_target(store_url, key_env)
    if host not in LOOPBACK:
        click.echo(f"note: the viewer shows run states to anyone who can reach {host}:{port}", err=True)
        if token is None:
            click.echo("note: without --token-env, approving works only from this machine", err=True)
    settings = ViewerSettings(target.store, target.keys, flows=flows, token=token, label=redact(store_url))
    click.echo(f"agentflow viewer on http://{host}:{port}/  (store {redact(store_url)}; Ctrl-C stops it)", err=True)
    try:
        serve(settings, host=host, port=port)
    except OSError as exc:
        raise _errors.explain(exc) from None


@click.command("demo")
@click.argument("folder", default="demo-runs", type=click.Path(file_okay=False, path_type=Path))
def demo(folder: Path) -> None:
    """Run the demo: three ticket orders, a worker killed mid-mail, the recovery (writes FOLDER/runs.db)."""
    from agentflow.demo.story import main

    code = main(folder)
    sys.exit(code)
