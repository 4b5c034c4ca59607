"""How values are written for a person, shared by every surface (the CLI, the viewer, the demo).

Only plain formatting lives here: no colours, no terminal, no web framework, so a surface
can use it without importing another surface.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def when(ts: float) -> str:
    """Write a save time as local ``YYYY-MM-DD HH:MM:SS``."""
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def short(value: Any, width: int = 60) -> str:
    """Write a value as compact JSON on one line, cut to `width` characters.

    A string is taken as it is; anything else is JSON with sorted keys (values JSON cannot
    encode are written with `str`). Runs of whitespace become one space.
    """
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def redact(url: str) -> str:
    """Return `url` with any password replaced by ``***`` (safe to print or log)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{parts.username or ''}:***@{host}{port}"
    return urlunsplit(parts._replace(netloc=netloc))
