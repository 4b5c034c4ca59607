"""``agentflow viewer`` (serve the run viewer) and ``agentflow demo`` (tell the crash story)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from agentflow._urls import redact
from agentflow.cli import _errors
from agentflow.cli._apps import import_app
from agentflow.cli._target import open_target, store_options
from agentflow.cli._text import echo

#: Hosts that only this machine can reach.
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _options(message: str, token_env: str | None) -> str:
    """A `ViewerSettings` error in the words of this command's options."""
    words = {
        "ViewerSettings.token_label": "--token-label",
        "ViewerSettings.token": f"--token-env {token_env}: ${token_env}",
        "ViewerSettings.allowed_hosts": "--allowed-host",
        "ViewerSettings.proxies": "--proxy",
        "ViewerSettings.workers": "--workers",
    }
    for setting, option in words.items():
        message = message.replace(setting, option)
    return message


@click.command("viewer")
@store_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option(
    "--token-env",
    metavar="NAME",
    help="Environment variable holding the token every action requires (22 or more random characters).",
)
@click.option(
    "--token-label",
    metavar="NAME",
    default="viewer",
    show_default=True,
    help="Who decides through this viewer: signed as the operator of each action (name the token holders).",
)
@click.option(
    "--app",
    "app_path",
    metavar="MODULE:ATTR",
    help="The FlowApp, to act on runs (approve, deny, cancel, retry, decide, fork); without it, read-only.",
)
@click.option(
    "--workers",
    "workers_path",
    metavar="MODULE:ATTR",
    envvar="AGENTFLOW_WORKERS",
    help="The deployment's AgentflowTasks (e.g. workers.celery_app:tasks): the workers run every tool an action "
    "starts, never the viewer ($AGENTFLOW_WORKERS; needs the celery extra).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    metavar="NAME[:PORT]",
    multiple=True,
    help="A host name browsers reach the viewer by, besides 127.0.0.1, localhost and [::1] (repeatable).",
)
@click.option(
    "--proxy",
    "proxies",
    metavar="ADDRESS",
    multiple=True,
    help="Address or network of a reverse proxy whose X-Forwarded-For/-Proto to believe (repeatable; none by default).",
)
def viewer(
    store_url: str,
    key_env: str,
    host: str,
    port: int,
    token_env: str | None,
    token_label: str,
    app_path: str | None,
    workers_path: str | None,
    allowed_hosts: tuple[str, ...],
    proxies: tuple[str, ...],
) -> None:
    """Serve the run viewer (a small web page over the store) until interrupted."""
    try:
        from agentflow.viewer import ViewerSettings, serve
    except ImportError as exc:
        raise _errors.CliError(
            f"the viewer needs the 'viewer' extra: pip install 'agentflow[viewer]' ({exc})"
        ) from None
    token = os.environ.get(token_env, "").strip() if token_env is not None else None
    if token_env is not None and not token:  # before the store is opened; ViewerSettings checks the rest
        raise _errors.CliError(f"--token-env {token_env}: ${token_env} must hold a token, and it is empty or unset")
    flows = import_app(app_path) if app_path else None
    target = open_target(store_url, key_env)
    try:
        settings = ViewerSettings(
            target.store,
            target.keys,
            flows=flows,
            token=token,
            label=redact(store_url),
            allowed_hosts=allowed_hosts,
            proxies=proxies,
            token_label=token_label,
            workers=workers_path or None,
        )
    except ValueError as exc:
        raise _errors.CliError(_options(str(exc), token_env)) from None
    if host not in LOOPBACK:
        echo(f"note: the viewer shows run states to anyone who can reach {host}:{port}", err=True)
        if not allowed_hosts:
            echo("note: browsers that reach it by a name need --allowed-host NAME (other names get a 400)", err=True)
        if token is None and not proxies:
            echo("note: without --token-env, acting on runs works only from this machine", err=True)
    if token is None and proxies:
        echo("note: with --proxy and without --token-env, nobody can act on runs from the viewer", err=True)
    echo(f"agentflow viewer on http://{host}:{port}/  (store {redact(store_url)}; Ctrl-C stops it)", err=True)
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
