"""Secrets a log must never show: a Redis user with a password of its own, and a search through captured logs.

`redis_user(url)` creates a Redis ACL user with a random password on the test server and
yields the URL that logs in as it (deleted afterwards): the workers' and stores' URLs then
carry a real password. `leaks(text, secrets)` names the secrets found in `text`, in every
form a log line could show them in (as given, hex, base64, Python's repr of bytes,
percent-encoded, and each piece of a text secret between the characters a URL reserves, so a
parser that cut the password at a ``/`` and quoted the half it took is caught).
`url_password()` makes a password holding every character a URL reserves in its user part.
"""

from __future__ import annotations

import base64
import re
import secrets
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import redis


@contextmanager
def redis_user(url: str) -> Iterator[tuple[str, str]]:
    """A Redis user with every right and a random password; yields ``(url as that user, password)``."""
    name, password = f"t{uuid.uuid4().hex[:12]}", "pw-" + secrets.token_hex(16)
    admin = redis.Redis.from_url(url)
    admin.acl_setuser(name, enabled=True, passwords=[f"+{password}"], keys=["*"], channels=["*"], commands=["+@all"])
    parts = urllib.parse.urlsplit(url)
    netloc = f"{name}:{password}@{parts.hostname}:{parts.port or 6379}"
    try:
        yield urllib.parse.urlunsplit(parts._replace(netloc=netloc)), password
    finally:
        admin.acl_deluser(name)
        admin.close()


#: The characters a URL's user part cannot hold raw, and ``+`` (form decoding makes it a space).
URL_RESERVED = "/#?@:+"


def url_password() -> str:
    """A random password with each of `URL_RESERVED` between random pieces of 10 characters."""
    return "".join(f"{secrets.token_hex(5)}{mark}" for mark in URL_RESERVED) + secrets.token_hex(5)


def forms(secret: str | bytes) -> set[str]:
    """The ways a log line could show `secret`."""
    raw = secret.encode() if isinstance(secret, str) else secret
    shown = {raw.hex(), base64.b64encode(raw).decode(), repr(raw)[2:-1]}
    if isinstance(secret, str):
        shown |= {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}
        shown |= set(re.split("[" + re.escape(URL_RESERVED) + "]", secret))
    return {form for form in shown if len(form) >= 8}


def leaks(text: str, found_in: Iterable[tuple[str, str | bytes]]) -> list[str]:
    """The names of the secrets (``(name, secret)``) that `text` shows in any of their forms."""
    return [name for name, secret in found_in if any(form in text for form in forms(secret))]
