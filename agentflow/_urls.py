"""URLs that may hold a password: the one redaction every surface uses, and how their parts are read.

Every URL agentflow takes (``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://`` with
``?sentinel_password=``, ``postgresql[+asyncpg]://``, ``sqlite[+aiosqlite]:///``, ``amqp[s]://``)
may carry a password in its user part, and some in a parameter. Three rules hold for all of them:

- `redact` is the only way a URL is shown (errors, log lines, reprs, the command line, the
  viewer). It works on the text, never raises, and finds the user part the way a person
  wrote it, not the way a parser would: from ``//`` to the *last* ``@`` (outside a secret
  parameter's value), so a password holding a raw ``/``, ``?``, ``#``, ``@``, ``:`` or ``+``
  is hidden whole even in a URL that no parser reads right. The value of every parameter
  whose name says it is secret (``sentinel_password``, ``password``, ``...token``) is hidden
  too. It may hide more than the password (a parameter holding an ``@``), never less.
- `check_user_part` refuses, before anything parses the URL, a user name or password that
  holds a raw ``/``, ``?``, ``#`` or ``@``: parsers split the URL elsewhere than the person
  meant (and quote the piece they took for a port or a path). The message says how to
  percent-encode it.
- A percent-encoded part is read with percent-decoding only (`decoded`, `query_params`):
  ``%2F`` is ``/`` and a ``+`` stays a ``+`` (form decoding would make it a space).
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote

#: What a shown URL has in place of a secret.
HIDDEN: Final = "***"
#: How to write a password that holds characters a URL reserves (for error messages).
HOW_TO_ENCODE: Final = (
    "percent-encode '/', '?', '#' and '@' in a user name or password, and '@' in a parameter's value "
    "(as %2F, %3F, %23, %40: urllib.parse.quote(password, safe='') does it)"
)
#: A scheme, as RFC 3986 writes it, with its colon.
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
#: A parameter whose name says it is a secret, and its value: up to the next parameter or the end.
_SECRET_PARAM: Final = re.compile(
    r"[?&;][^=&?#;]*(?:pass|secret|token|auth)[^=&?#;]*=(?P<value>.*?)(?=&[A-Za-z_][\w.-]*=|$)", re.I | re.S
)
#: The characters that end a URL's host part: one of them in a user part means it was not encoded.
_RESERVED: Final = frozenset("/?#@")


def _secret_values(url: str) -> list[tuple[int, int]]:
    """The spans of the values of the parameters whose names say they are secret."""
    return [m.span("value") for m in _SECRET_PARAM.finditer(url)]


def _user_part(url: str, secret_values: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The span of the user part (``user:password``) as written: from ``//`` to the last ``@`` not in a secret."""
    scheme = _SCHEME.match(url)
    start = scheme.end() if scheme else 0
    if url.startswith("//", start):
        start += 2
    if url.startswith("/", start):  # sqlite:///path: no host part, an @ is the file's
        return None
    at = next(
        (i for i in range(len(url) - 1, start - 1, -1) if url[i] == "@" and not _inside(i, secret_values)),
        -1,
    )
    return (start, at) if at >= 0 else None


def _inside(index: int, spans: list[tuple[int, int]]) -> bool:
    return any(begin <= index < end for begin, end in spans)


def redact(url: str) -> str:
    """Return `url` with its password and secret parameters replaced by ``***`` (safe to print or log).

    The user name stays when it is plainly one (written before a ``:`` and holding no
    reserved character); otherwise the whole user part is hidden. Works on any text: a URL
    no parser accepts is hidden as well as a good one.
    """
    values = _secret_values(url)
    user_part = _user_part(url, values)
    spans = sorted(values + ([user_part] if user_part else []))
    out, shown_to = [], 0
    for begin, end in spans:
        if end <= shown_to:  # inside a part already hidden
            continue
        if (begin, end) == user_part:
            user, colon, _ = url[begin:end].partition(":")
            plain = colon and not _RESERVED.intersection(user)
            out += [url[shown_to:begin], f"{user}:{HIDDEN}" if plain else HIDDEN]
        else:
            out += [url[shown_to:begin], HIDDEN]
        shown_to = end
    return "".join([*out, url[shown_to:]])


def check_user_part(url: str, what: str, error: type[ValueError] = ValueError) -> None:
    """Refuse a URL whose user name or password holds a raw ``/``, ``?``, ``#`` or ``@``.

    Args:
        url: the URL as given.
        what: what the URL is, for the message (``"--store"``, ``"AGENTFLOW_BROKER_URL"``).
        error: the kind of `ValueError` to raise.

    Raises:
        ValueError: (`error`) the user part is not percent-encoded; the message shows the URL redacted.
    """
    user_part = _user_part(url, _secret_values(url))
    if user_part is not None and _RESERVED.intersection(url[slice(*user_part)]):
        raise error(f"{what} {redact(url)!r}: {HOW_TO_ENCODE}")


def split_query(url: str) -> tuple[str, str]:
    """Split `url` into what comes before its query and the query (``""`` if none), without the ``?``.

    The query starts at the first ``?`` after the user part, so a ``?`` in a password (or
    a ``#`` in a parameter's value: agentflow's URLs have no fragments) does not cut it.
    """
    user_part = _user_part(url, _secret_values(url))
    mark = url.find("?", user_part[1] if user_part else 0)
    return (url, "") if mark < 0 else (url[:mark], url[mark + 1 :])


def query_params(query: str) -> list[tuple[str, str]]:
    """The ``name=value`` pairs of a query, percent-decoded only (a ``+`` stays a ``+``); blank values kept."""
    pairs = []
    for item in query.split("&"):
        if item:
            name, _, value = item.partition("=")
            pairs.append((decoded(name), decoded(value)))
    return pairs


def decoded(part: str) -> str:
    """A percent-encoded part of a URL as it was meant (``%2F`` is ``/``; ``+`` is ``+``)."""
    return unquote(part)
