"""Store URLs: one place that turns a store URL (``--store``, ``AGENTFLOW_STORE_URL``) into a `CheckpointStore`.

The command line and the fleet's factory (`agentflow.celery.make_app`) both open
stores through it.

Accepted forms (the error for anything else lists them):

- ``sqlite:///runs.db`` (relative path) or ``sqlite:////abs/path.db``: `SQLiteCheckpointStore`;
- ``redis://host:6379/0?prefix=agentflow&ttl_s=604800`` (also ``rediss://``, and
  ``redis+sentinel://host:26379,host2:26379/<primary name>/0``): `RedisCheckpointStore`, with
  its durability options as ``wait_replicas=1``, ``wait_fsync=1``, ``wait_timeout_s=1.0``;
- ``postgresql+asyncpg://user@host/db`` and ``sqlite+aiosqlite:///runs.db``, with an optional
  ``?table_prefix=agentflow_``: `SQLAlchemyCheckpointStore` (on SQLite the portable path,
  slower than the ``sqlite:///`` store).

The parameters agentflow reads (``prefix``, ``ttl_s``, the durability options,
``allow_volatile``, ``table_prefix``) are taken out of the URL before the rest goes to the
driver, which gets the others as they were written. Values are percent-decoded only (a ``+``
stays a ``+``). A password holding ``/``, ``?``, ``#`` or ``@`` is written percent-encoded
(``%2F``, ...); one that is not is refused before anything parses the URL. Passwords never
appear in messages: every one shows the URL through `agentflow._urls.redact`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from agentflow._urls import check_user_part, decoded, redact, split_query
from agentflow.exec.checkpoints import CheckpointStore

#: What ``--store`` accepts, for error messages.
ACCEPTED: Final = (
    "sqlite:///relative.db, sqlite:////abs/path.db, redis://host:6379/0?prefix=agentflow, "
    "redis+sentinel://host:26379,host2:26379/<primary name>/0, "
    "postgresql+asyncpg://user@host/db or sqlite+aiosqlite:///runs.db (SQL: ?table_prefix=...)"
)


class StoreURLError(ValueError):
    """Raised when a store URL is not one of the accepted forms."""


def _bad(url: str, why: str) -> StoreURLError:
    return StoreURLError(f"--store {redact(url)!r}: {why}; use {ACCEPTED}")


def _take(url: str, allowed: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """Split agentflow's own query parameters off `url` (decoded); the driver's stay in the URL as written."""
    base, query = split_query(url)
    ours: dict[str, str] = {}
    theirs: list[str] = []
    for item in filter(None, query.split("&")):
        name, _, value = item.partition("=")
        if decoded(name) in allowed:
            ours[decoded(name)] = decoded(value)
        else:
            theirs.append(item)
    # Rebuilt by hand: urlunsplit drops the "//" of schemes it does not know (sqlite+aiosqlite:///x.db).
    return (f"{base}?{'&'.join(theirs)}" if theirs else base), ours


def sqlite_path(url: str) -> Path:
    """Return the file a ``sqlite:///`` or ``sqlite+aiosqlite:///`` URL names.

    Raises:
        StoreURLError: the URL names a host, no file, or an in-memory database.
    """
    parts = urlsplit(url)
    if parts.netloc:
        raise _bad(url, "a SQLite URL has three slashes (sqlite:///file.db) and no host")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path == ":memory:":
        raise _bad(url, "name a database file; an in-memory database cannot be shared")
    return Path(path)


def _check_exists(url: str, path: Path) -> None:
    if not path.is_file():
        raise StoreURLError(f"--store {redact(url)!r}: there is no database file at {path.absolute()}")


def _sqlite(url: str, must_exist: bool) -> CheckpointStore:
    from agentflow.exec.checkpoints.sqlite import SQLiteCheckpointStore

    if urlsplit(url).query:
        raise _bad(url, "a sqlite:/// URL takes no parameters")
    path = sqlite_path(url)
    if must_exist:
        _check_exists(url, path)
    return SQLiteCheckpointStore(path)


def _redis(url: str) -> CheckpointStore:
    from agentflow.exec.checkpoints import RedisCheckpointStore  # ImportError names the extra

    clean, ours = _take(url, ("prefix", "ttl_s", "wait_replicas", "wait_fsync", "wait_timeout_s", "allow_volatile"))
    ttl_s: int | None = 7 * 24 * 3600
    if "ttl_s" in ours:
        raw = ours["ttl_s"]
        if raw.lower() != "none" and not raw.isdigit():
            raise _bad(url, f"ttl_s must be a number of seconds or 'none', not {raw!r}")
        ttl_s = None if raw.lower() == "none" else int(raw)
    replicas = ours.get("wait_replicas", "0")
    if not replicas.isdigit():
        raise _bad(url, f"wait_replicas must be a whole number of replicas, not {replicas!r}")
    try:
        timeout = float(ours.get("wait_timeout_s", "1.0"))
    except ValueError:
        raise _bad(url, f"wait_timeout_s must be a number of seconds, not {ours['wait_timeout_s']!r}") from None
    store: CheckpointStore = RedisCheckpointStore.from_url(
        clean,
        prefix=ours.get("prefix", "agentflow"),
        ttl_s=ttl_s,
        wait_replicas=int(replicas),
        wait_fsync=_flag(url, ours, "wait_fsync", False),
        wait_timeout_s=timeout,
        allow_volatile=_flag(url, ours, "allow_volatile", True),
    )
    return store


def _flag(url: str, ours: dict[str, str], name: str, default: bool) -> bool:
    raw = ours.get(name)
    if raw is None:
        return default
    if raw.lower() not in ("0", "1", "true", "false"):
        raise _bad(url, f"{name} must be 1 or 0, not {raw!r}")
    return raw.lower() in ("1", "true")


def _sql(url: str, must_exist: bool) -> CheckpointStore:
    from agentflow.exec.checkpoints import SQLAlchemyCheckpointStore  # ImportError names the extra

    clean, ours = _take(url, ("table_prefix", "allow_volatile"))
    if must_exist and url.startswith("sqlite+aiosqlite:"):
        _check_exists(url, sqlite_path(clean))
    store: CheckpointStore = SQLAlchemyCheckpointStore(
        clean,
        table_prefix=ours.get("table_prefix", "agentflow_"),
        allow_volatile=_flag(url, ours, "allow_volatile", True),
    )
    return store


def open_store(url: str, *, must_exist: bool = True) -> CheckpointStore:
    """Make the checkpoint store that `url` names (no connection is opened yet).

    Args:
        url: a store URL in one of the `ACCEPTED` forms.
        must_exist: refuse a SQLite file that does not exist yet (a typo would otherwise
            create an empty database and show no runs).

    Raises:
        StoreURLError: the URL is not an accepted form, or its SQLite file is missing.
        ImportError: the backend's extra is not installed (the message names it).
    """
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    check_user_part(url, "--store", StoreURLError)
    try:
        if scheme == "sqlite":
            return _sqlite(url, must_exist)
        if scheme in ("redis", "rediss", "redis+sentinel"):
            return _redis(url)
        if scheme in ("postgresql+asyncpg", "sqlite+aiosqlite"):
            return _sql(url, must_exist)
    except StoreURLError:
        raise
    except ValueError as exc:  # a store refused its settings (prefix, table_prefix, ...)
        raise _bad(url, str(exc)) from None
    if scheme.startswith("postgres"):
        raise _bad(url, "PostgreSQL needs the asyncpg driver: write postgresql+asyncpg://")
    raise _bad(url, "not a store URL")
