"""Import of the backends that need an extra, with an error that names the extra."""

from __future__ import annotations

import importlib
from typing import Any


def load_optional(module: str, name: str, extra: str) -> Any:
    """Import `name` from `module`, or say which extra to install.

    Raises:
        ImportError: the backend's driver is not installed.
    """
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ImportError(f"{name} needs the {extra!r} extra: pip install 'agentflow[{extra}]' ({exc})") from exc
