"""The checkpoint key, read from an environment variable and never shown.

The variable holds one key, or several separated by commas (newest first, for rotation).
Each is written ``hex:<hex digits>``, ``base64:<base64>``, or as a plain string whose UTF-8
bytes are the key. Messages name the variable and the position of a bad key, never a value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from agentflow._keys import parse_keys
from agentflow.exec._durable_seal import key_id

#: The variable read when ``--key-env`` is not given.
DEFAULT_KEY_ENV = "AGENTFLOW_CHECKPOINT_KEYS"


class KeyProblem(ValueError):
    """Raised when the key variable is missing, empty, malformed or too short."""


def read_keys(env_name: str = DEFAULT_KEY_ENV, environ: Mapping[str, str] | None = None) -> list[bytes]:
    """Return the keys held in the variable `env_name`, newest first.

    Raises:
        KeyProblem: the variable is unset or empty, or a key cannot be decoded or is shorter
            than 32 bytes.
    """
    raw = (os.environ if environ is None else environ).get(env_name, "").strip()
    if not raw:
        raise KeyProblem(
            f"the checkpoint key is not set: put the key your workers use in ${env_name} "
            "(hex:..., base64:... or a plain string of 32+ bytes), or name another variable with --key-env"
        )
    try:
        return parse_keys(raw, source=f"${env_name}")
    except ValueError as exc:
        raise KeyProblem(str(exc)) from None


def key_ids(keys: list[bytes]) -> list[str]:
    """Return the public ids of `keys` (what rows name; safe to show)."""
    return [key_id(key) for key in keys]
