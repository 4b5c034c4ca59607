"""Reading checkpoint keys from text (environment variables, files): one parser for every surface."""

from __future__ import annotations

import base64
import binascii

from agentflow.exec._durable_seal import MIN_KEY_BYTES


def parse_keys(text: str, *, source: str = "the key") -> list[bytes]:
    """Parse one key or a comma-separated list (newest first) into bytes.

    Each key is ``hex:<hex digits>``, ``base64:<base64>``, or plain text (its UTF-8 bytes).

    Raises:
        ValueError: a key is empty, malformed or shorter than 32 bytes; the message names
            `source` and never contains the key.
    """
    keys: list[bytes] = []
    parts = [p.strip() for p in text.split(",")]
    for i, part in enumerate(parts):
        where = source if len(parts) == 1 else f"{source} (key {i + 1})"
        if not part:
            raise ValueError(f"{where} is empty")
        try:
            if part.startswith("hex:"):
                key = bytes.fromhex(part[4:])
            elif part.startswith("base64:"):
                key = base64.b64decode(part[7:], validate=True)
            else:
                key = part.encode()
        except (ValueError, binascii.Error):
            raise ValueError(f"{where} is not valid {part.partition(':')[0]}") from None
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(
                f"{where} has {len(key)} bytes; it needs at least {MIN_KEY_BYTES} "
                "(make one with: python -c \"import secrets; print('hex:' + secrets.token_hex(32))\")"
            )
        keys.append(key)
    return keys
