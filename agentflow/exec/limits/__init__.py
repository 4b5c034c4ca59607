"""Limits shared by every worker: concurrency and rate per tool, per model provider and per tenant key."""

import typing

from agentflow import _optional
from agentflow.exec.limits._backends import BackendSpec
from agentflow.exec.limits._local import LocalLimits
from agentflow.exec.limits._protocol import LimitBackend, Refusal
from agentflow.exec.limits._spec import Limit, LimitKey

if typing.TYPE_CHECKING:
    from agentflow.exec.limits.redis import RedisLimits
    from agentflow.exec.limits.sql import SQLLimits

__all__ = [
    "BackendSpec",
    "Limit",
    "LimitBackend",
    "LimitKey",
    "LocalLimits",
    "RedisLimits",
    "Refusal",
    "SQLLimits",
]


#: The backends on optional extras: name -> (module, extra).
_OPTIONAL = {
    "RedisLimits": ("agentflow.exec.limits.redis", "redis"),
    "SQLLimits": ("agentflow.exec.limits.sql", "sqlalchemy"),
}


__getattr__ = _optional.lazy_attributes(__name__, _OPTIONAL)
