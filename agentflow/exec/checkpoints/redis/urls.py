"""Redis URLs: a plain server (``redis://``, ``rediss://``, ``unix://``) or a primary found through Sentinel.

``redis+sentinel://[[user]:password@]host:port[,host:port...]/<primary name>[/<db>][?sentinel_password=...]``
names the Sentinels (26379 when a port is left out), the name they know the primary
by, and the database. The password in the URL is the primary's; the Sentinels' own, if
they have one, is ``sentinel_password``. A client made from it asks a Sentinel for the
primary's address on every new connection, and a connection to a server that is no
longer the primary (gone, or demoted to a replica) fails and is made again, so clients
follow a failover without a restart. Nothing here connects: `parse_sentinel` only reads
the URL, and the factory makes clients when the store first needs one.

Passwords are percent-encoded (``%2F`` for ``/``) and read with percent-decoding only, the
user's and ``sentinel_password`` alike: a ``+`` stays a ``+``. A user part holding a raw
``/``, ``?``, ``#`` or ``@`` is refused before redis-py parses it (it would take part of the
password for a port and quote it); every message shows the URL through `agentflow._urls.redact`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.connection import parse_url
from redis.asyncio.sentinel import Sentinel

from agentflow._urls import check_user_part, decoded, query_params, redact, split_query

#: The scheme of a Sentinel URL.
SENTINEL_SCHEME = "redis+sentinel"
#: The port of a Sentinel named without one.
SENTINEL_PORT = 26379


class SentinelPrimary(Redis):
    """A client of the primary Sentinel names; closing it closes the clients it asks the Sentinels with too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close the client and the Sentinels' clients it found the primary with."""
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()


@dataclass(frozen=True)
class SentinelURL:
    """What a ``redis+sentinel://`` URL says."""

    hosts: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def parse_sentinel(url: str) -> SentinelURL:
    """Read a ``redis+sentinel://`` URL (see the module notes).

    Raises:
        ValueError: the URL names no Sentinel, no primary, a bad port or database, an
            unknown parameter, or a password not percent-encoded (the message shows the URL
            without its password).
    """
    shown = redact(url)
    if not url.startswith(f"{SENTINEL_SCHEME}://"):
        raise ValueError(f"{shown!r} is not a {SENTINEL_SCHEME}:// URL")
    check_user_part(url, "the Sentinel URL")
    before_query, query_text = split_query(url)
    parts = urlsplit(before_query)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    hosts = []
    for item in filter(None, hostlist.split(",")):
        host, _, port = item.rpartition(":") if item.count(":") == 1 else (item, "", "")
        if not port.isdigit() and port:
            raise ValueError(f"{shown!r}: the Sentinel {item!r} has a port that is not a number")
        hosts.append((host or item, int(port) if port else SENTINEL_PORT))
    names = [decoded(p) for p in parts.path.split("/") if p]
    if not hosts or not names or len(names) > 2 or (len(names) == 2 and not names[1].isdigit()):
        raise ValueError(
            f"{shown!r}: write redis+sentinel://host:26379,host2:26379/<primary name>[/<db>], naming at least "
            "one Sentinel and the name the Sentinels know the primary by (their 'sentinel monitor' name)"
        )
    query = dict(query_params(query_text))
    unknown = sorted(set(query) - {"sentinel_password"})
    if unknown:
        raise ValueError(f"{shown!r}: unknown parameter(s) {unknown}; a Sentinel URL takes sentinel_password")
    return SentinelURL(
        tuple(hosts),
        names[0],
        int(names[1]) if len(names) == 2 else 0,
        decoded(username) or None,
        decoded(password) or None,
        query.get("sentinel_password") or None,
    )


def check_plain(url: str) -> None:
    """Read a ``redis://``, ``rediss://`` or ``unix://`` URL as redis-py will, now rather than at the first command.

    Raises:
        ValueError: the port or the database is not a number, or redis-py refuses the URL
            (the message shows the URL without its password).
    """
    try:
        parse_url(url)
    except ValueError as exc:
        raise ValueError(f"{redact(url)!r}: {exc}") from None
    path = urlsplit(split_query(url)[0]).path.strip("/")
    if not url.startswith("unix://") and path and not path.isdigit():
        raise ValueError(f"{redact(url)!r}: the database {path!r} is not a number (write redis://host:6379/0)")


def client_factory(url: str, connect_timeout_s: float | None) -> Callable[[], Redis]:
    """What makes the store's clients for `url`: one per event loop, with no socket timeout of their own.

    Raises:
        ValueError: `url` is not a redis://, rediss://, unix:// or redis+sentinel:// URL, or its
            password is not percent-encoded.
    """
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://", f"{SENTINEL_SCHEME}://")):
        shown = redact(str(url))
        raise ValueError(f"url must be a redis://, rediss://, unix:// or {SENTINEL_SCHEME}:// URL; got {shown!r}")
    check_user_part(url, "the Redis URL")
    if not url.startswith(f"{SENTINEL_SCHEME}://"):
        check_plain(url)
        return lambda: Redis.from_url(url, socket_timeout=None, socket_connect_timeout=connect_timeout_s)
    found = parse_sentinel(url)

    def client() -> Redis:
        sentinels = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            list(found.hosts),
            sentinel_kwargs={"password": found.sentinel_password, "socket_timeout": connect_timeout_s},
        )
        primary: Redis = sentinels.master_for(
            found.service,
            redis_class=SentinelPrimary,
            db=found.db,
            username=found.username,
            password=found.password,
            socket_timeout=None,
            socket_connect_timeout=connect_timeout_s,
        )
        return primary

    return client
