"""The machine, the versions of everything measured, and the servers the suite may use.

Servers: Redis at ``BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) and PostgreSQL
at ``BENCH_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``). A server that
does not answer is reported, and the parts that need it are skipped with that reason.
"""

from __future__ import annotations

import asyncio
import os
import platform
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")

#: Distributions whose versions go with every result.
_PACKAGES = (
    "agentflow",
    "pydantic",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "langchain-core",
    "redis",
    "hiredis",
    "fakeredis",
    "sqlalchemy",
    "asyncpg",
    "aiosqlite",
    "psycopg",
    "matplotlib",
)


@dataclass
class Services:
    """Which servers answered: a URL, or None with the reason in `*_why`."""

    redis_url: str | None
    redis_why: str
    redis_version: str | None
    pg_url: str | None
    pg_why: str
    pg_version: str | None

    @property
    def pg_sqlalchemy_url(self) -> str | None:
        return None if self.pg_url is None else self.pg_url.replace("postgresql://", "postgresql+asyncpg://", 1)


async def _probe_redis() -> tuple[str | None, str, str | None]:
    try:
        import redis.asyncio as aioredis
    except ImportError:
        return None, "the redis package is not installed", None
    client = aioredis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        info = await asyncio.wait_for(client.info("server"), 5)
        return REDIS_URL, "", str(info.get("redis_version"))
    except Exception as exc:
        return None, f"Redis at {REDIS_URL} does not answer ({type(exc).__name__}: {exc})", None
    finally:
        await client.aclose()


async def _probe_pg() -> tuple[str | None, str, str | None]:
    try:
        import asyncpg
    except ImportError:
        return None, "the asyncpg package is not installed", None
    try:
        conn = await asyncio.wait_for(asyncpg.connect(PG_URL), 5)
    except Exception as exc:
        return None, f"PostgreSQL at {PG_URL} does not answer ({type(exc).__name__}: {exc})", None
    try:
        return PG_URL, "", str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()


async def probe_services() -> Services:
    (r_url, r_why, r_ver), (p_url, p_why, p_ver) = await asyncio.gather(_probe_redis(), _probe_pg())
    return Services(r_url, r_why, r_ver, p_url, p_why, p_ver)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _filesystem(path: Path) -> str:
    """The type of the filesystem holding `path` (SQLite's fsync cost depends on it)."""
    best, kind = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _dev, mount, fstype, *_ = line.split()
            if str(path.resolve()).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    except OSError:
        pass
    return kind


def _git() -> str:
    """The commit measured (read-only git commands), with ``+dirty`` if the tree has changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def versions(services: Services) -> dict[str, str]:
    found = {
        "python": platform.python_version(),
        "sqlite (library)": sqlite3.sqlite_version,
        "redis server": services.redis_version or "not reached",
        "postgresql server": services.pg_version or "not reached",
    }
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    try:
        from bench._services import redis_parser

        found["redis-py reply parser"] = redis_parser()
    except ImportError:
        pass
    return found


def machine(tmp: Path) -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "python_executable": sys.executable,
        "tmp_filesystem": _filesystem(tmp),
        "load_average_at_start": os.getloadavg(),
        "commit": _git(),
    }
