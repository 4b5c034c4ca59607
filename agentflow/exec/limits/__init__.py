"""Limits shared by every worker: concurrency and rate per tool, per model provider and per tenant key."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentflow.exec.limits._backends import BackendSpec
from agentflow.exec.limits._local import LocalLimits
from agentflow.exec.limits._protocol import LimitBackend, Wait
from agentflow.exec.limits._spec import Limit, LimitKey, LimitsUnavailable, RateLimited

if TYPE_CHECKING:
    from agentflow.exec.limits.redis import RedisLimits
    from agentflow.exec.limits.sql import SQLLimits

__all__ = [
    "BackendSpec",
    "Limit",
    "LimitBackend",
    "LimitKey",
    "LimitsUnavailable",
    "LocalLimits",
    "RateLimited",
    "RedisLimits",
    "SQLLimits",
    "Wait",
]


#: The backends on optional extras: name -> (module, extra).
_OPTIONAL = {"RedisLimits": ("redis", "redis"), "SQLLimits": ("sql", "sqlalchemy")}


def __getattr__(name: str) -> Any:
    if name not in _OPTIONAL:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, extra = _OPTIONAL[name]
    try:
        found = importlib.import_module(f"{__name__}.{module}")
    except ImportError as exc:  # pragma: no cover - the extras are installed in the test environment
        raise ImportError(f"{name} needs the {extra} extra: pip install 'agentflow[{extra}]' ({exc})") from exc
    return getattr(found, name)
