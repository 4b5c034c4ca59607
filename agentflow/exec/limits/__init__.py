"""Limits shared by every worker: concurrency and rate per tool, per model provider and per tenant key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentflow.exec.limits._backends import BackendSpec
from agentflow.exec.limits._local import LocalLimits
from agentflow.exec.limits._protocol import LimitBackend, Wait
from agentflow.exec.limits._spec import Limit, LimitKey, LimitsUnavailable, RateLimited

if TYPE_CHECKING:
    from agentflow.exec.limits.redis import RedisLimits

__all__ = [
    "BackendSpec",
    "Limit",
    "LimitBackend",
    "LimitKey",
    "LimitsUnavailable",
    "LocalLimits",
    "RateLimited",
    "RedisLimits",
    "Wait",
]


def __getattr__(name: str) -> Any:
    if name == "RedisLimits":
        try:
            from agentflow.exec.limits.redis import RedisLimits
        except ImportError as exc:  # pragma: no cover - the extra is installed in the test environment
            raise ImportError(f"RedisLimits needs the redis extra: pip install 'agentflow[redis]' ({exc})") from exc
        return RedisLimits
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
