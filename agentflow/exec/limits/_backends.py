"""Naming a limits backend once, and making it lazily in each process that uses it.

A registry is given a `BackendSpec`: None or ``"local"`` (this process only), a Redis URL,
a SQL URL (PostgreSQL, or a SQLite file for the processes of one host), a factory, or a
backend object. Nothing is made when it is given: the
first call under a limit in a process makes that process's backend, and a process forked
after that (a Celery prefork child) makes its own, never sharing its parent's clients.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final, TypeAlias

from agentflow.exec.limits._local import LocalLimits
from agentflow.exec.limits._protocol import LimitBackend

#: How a backend is named: None or "local", a Redis or SQL URL (``#prefix`` at its end), a factory, or a backend.
BackendSpec: TypeAlias = "str | Callable[[], LimitBackend] | LimitBackend | None"

#: URL schemes of the Redis backend and of the SQL one.
_REDIS: Final = ("redis://", "rediss://", "unix://")
_SQL: Final = ("postgresql+asyncpg://", "sqlite+aiosqlite://")


def _check(spec: BackendSpec) -> None:
    if spec is None or (isinstance(spec, str) and spec == "local"):
        return
    if isinstance(spec, str):
        if not spec.startswith(_REDIS + _SQL):
            known = ", ".join(_REDIS + _SQL)
            raise ValueError(f"a limits backend URL is 'local' or one of {known}; got {spec!r}")
        return
    if not callable(spec) and not isinstance(spec, LimitBackend):
        raise TypeError(f"a limits backend is a URL, a factory or a LimitBackend, not {spec!r}")


class BackendRef:
    """A named backend, made on first use in each process."""

    def __init__(self, spec: BackendSpec = None) -> None:
        """Name the backend; make nothing yet.

        Raises:
            ValueError: a URL of an unknown scheme.
            TypeError: `spec` is none of the accepted kinds.
        """
        _check(spec)
        self.spec = spec
        self._made: LimitBackend | None = None
        self._pid = -1

    def get(self) -> LimitBackend:
        """This process's backend (made now if this process has none yet)."""
        if self._made is None or self._pid != os.getpid():
            self._made, self._pid = self._make(), os.getpid()
        return self._made

    def _make(self) -> LimitBackend:
        spec = self.spec
        if spec is None or spec == "local":
            return LocalLimits()
        if isinstance(spec, str) and spec.startswith(_SQL):
            from agentflow.exec.limits.sql import SQLLimits  # the sqlalchemy extra, only when named

            url, _, prefix = spec.partition("#")
            return SQLLimits(url, table_prefix=prefix or "agentflow_")
        if isinstance(spec, str):
            from agentflow.exec.limits.redis import RedisLimits  # the redis extra, only when named

            return RedisLimits.from_url(spec)
        if isinstance(spec, LimitBackend) and not isinstance(spec, type):
            return spec  # a backend object is lazy itself (RedisLimits makes clients per process)
        assert callable(spec)
        made = spec()
        if not isinstance(made, LimitBackend):
            raise TypeError(f"the limits backend factory returned {made!r}, not a LimitBackend")
        return made
