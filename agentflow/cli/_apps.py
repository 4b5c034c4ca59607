"""``--app module:attr``: import the user's `FlowApp` the way ``python -m`` would find it (``--workers`` too)."""

from __future__ import annotations

import os
import sys

from agentflow._app import FlowApp, load_app
from agentflow.cli._errors import CliError


def search_cwd() -> None:
    """Put the current directory on ``sys.path``, as ``python -m`` does (a console script does not)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def import_app(path: str) -> FlowApp:
    """Import the `FlowApp` at `path`, looking in the current directory first.

    Raises:
        CliError: the path is malformed, does not import, or is not a FlowApp.
    """
    search_cwd()
    try:
        return load_app(path)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:  # the user's module failed while importing
        raise CliError(f"--app {path!r}: importing it failed ({type(exc).__name__}: {exc})") from None
