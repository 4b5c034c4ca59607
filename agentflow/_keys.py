"""Reading checkpoint keys from text (environment variables, files): one parser for every surface.

The CLI (``--key-env``) and the workers' settings (``AGENTFLOW_CHECKPOINT_KEYS``) read keys
here, and refuse what cannot be a good secret: a key shorter than 32 bytes, one with fewer
than 16 distinct byte values (``"a" * 32``, a typed pattern), plain text made only of hex
digits (did you mean ``hex:``?), and the demo's public key unless the caller allows it. No
message ever contains a key, nor any part of one.

The library itself (``FlowRunner(checkpoint_key=...)``) takes bytes and checks their length
only: these rules are for keys a person writes into a variable or a file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import string
from typing import Final

from agentflow.exec.seal import MIN_KEY_BYTES

#: A key with fewer distinct byte values than this was not drawn at random (32 random bytes
#: have about 30 distinct values; fewer than 16 happens with odds of about 3e-17).
MIN_DISTINCT_BYTES: Final = 16
#: SHA-256 of each key agentflow itself publishes: the demo's (``agentflow.demo.worker.DEMO_KEY``).
#: Anyone can sign rows with these, so they protect nothing.
PUBLIC_KEY_DIGESTS: Final = frozenset({"959e43400c34be7aa7f739dd7603d368c35e7823c56ede3d33e41bcb295b1fa7"})
#: How to make a good key (every refusal says it).
MAKE_ONE: Final = "make one with: python -c \"import secrets; print('hex:' + secrets.token_hex(32))\""
#: A plain-text key made only of these was most likely meant as ``hex:``.
_HEX_DIGITS: Final = frozenset(string.hexdigits)


class PublicKeyRefused(ValueError):
    """Raised when a key is one agentflow publishes (the demo's) and the caller did not allow it."""


def is_public(key: bytes) -> bool:
    """Whether `key` is one agentflow publishes (the demo's): anyone can sign with it."""
    return hashlib.sha256(key).hexdigest() in PUBLIC_KEY_DIGESTS


def _decode(part: str, where: str) -> bytes:
    try:
        if part.startswith("hex:"):
            return bytes.fromhex(part[4:])
        if part.startswith("base64:"):
            return base64.b64decode(part[7:], validate=True)
    except (ValueError, binascii.Error):
        raise ValueError(f"{where} is not valid {part.partition(':')[0]}; {MAKE_ONE}") from None
    # (One character repeated is refused as a pattern instead, by `check_key`.)
    if len(part) >= MIN_KEY_BYTES and set(part) <= _HEX_DIGITS and len(set(part)) > 1:
        raise ValueError(
            f"{where} is {len(part)} hex digits without a prefix, which would be read as text, not as hex: "
            f"write hex:<the digits> if they are hex (or {MAKE_ONE})"
        )
    return part.encode()


def check_key(key: bytes, where: str = "the key", *, allow_public: bool = False) -> None:
    """Refuse a key that is short, not random-looking, or public (the messages name `where`, never the key).

    Args:
        key: the key's bytes.
        where: what names the key in messages (``$AGENTFLOW_CHECKPOINT_KEYS (key 2)``).
        allow_public: accept the demo's public key (only to look at the demo's runs).

    Raises:
        ValueError: the key is shorter than 32 bytes or has fewer than 16 distinct byte values.
        PublicKeyRefused: the key is the demo's public key and `allow_public` is False.
    """
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{where} has {len(key)} bytes; it needs at least {MIN_KEY_BYTES} ({MAKE_ONE})")
    distinct = len(set(key))
    if distinct < MIN_DISTINCT_BYTES:
        what = "one byte repeated" if distinct == 1 else f"only {distinct} distinct byte values"
        raise ValueError(
            f"{where} is {what}, so it was not drawn at random and is easy to guess; "
            f"use {MIN_KEY_BYTES} random bytes ({MAKE_ONE})"
        )
    if is_public(key) and not allow_public:
        raise PublicKeyRefused(
            f"{where} is the demo's public key, which anyone can sign with: it protects nothing; "
            f"give the key your workers sign with ({MAKE_ONE})"
        )


def parse_keys(text: str, *, source: str = "the key", allow_public: bool = False) -> list[bytes]:
    """Parse one key or a comma-separated list (newest first) into bytes, and check each (`check_key`).

    Each key is ``hex:<hex digits>``, ``base64:<base64>``, or plain text (its UTF-8 bytes);
    plain text made only of hex digits is refused as ambiguous.

    Args:
        text: the key or keys, as written in the variable or file.
        source: what names the keys in messages (``$AGENTFLOW_CHECKPOINT_KEYS``).
        allow_public: accept the demo's public key (only to look at the demo's runs).

    Raises:
        ValueError: a key is empty, malformed, ambiguous, short, not random-looking or
            public; the message names `source` (and the key's position in a list), says
            how to make a good key, and never contains the key.
        PublicKeyRefused: a key is the demo's public key and `allow_public` is False.
    """
    keys: list[bytes] = []
    parts = [p.strip() for p in text.split(",")]
    for i, part in enumerate(parts):
        where = source if len(parts) == 1 else f"{source} (key {i + 1})"
        if not part:
            raise ValueError(f"{where} is empty")
        key = _decode(part, where)
        check_key(key, where, allow_public=allow_public)
        keys.append(key)
    return keys
