"""The checkpoint key, read from an environment variable and never shown.

The variable holds one key, or several separated by commas (newest first, for rotation).
Each is written ``hex:<hex digits>``, ``base64:<base64>``, or as a plain string whose UTF-8
bytes are the key; `agentflow._keys.parse_keys` reads it and refuses a short, patterned,
ambiguous or public key. Messages name the variable and the position of a bad key, never a
value. The demo's public key is refused unless the command was told to accept it
(``--allow-demo-key`` or ``AGENTFLOW_ALLOW_DEMO_KEY=1``), to look at the demo's runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from agentflow._keys import PublicKeyRefused, parse_keys
from agentflow.exec.seal import key_id

#: The variable read when ``--key-env`` is not given.
DEFAULT_KEY_ENV: Final = "AGENTFLOW_CHECKPOINT_KEYS"
#: The variable that, set to 1, accepts the demo's public key (as ``--allow-demo-key`` does).
ALLOW_DEMO_KEY_ENV: Final = "AGENTFLOW_ALLOW_DEMO_KEY"


class KeyProblem(ValueError):
    """Raised when the key variable is missing, empty, malformed or not a key to trust."""


def read_keys(
    env_name: str = DEFAULT_KEY_ENV, environ: Mapping[str, str] | None = None, *, allow_demo_key: bool = False
) -> list[bytes]:
    """Return the keys held in the variable `env_name`, newest first.

    Args:
        env_name: the variable to read.
        environ: where to read it (default: the process environment).
        allow_demo_key: accept the demo's public key (to look at the demo's runs).

    Raises:
        KeyProblem: the variable is unset or empty, or a key cannot be decoded, is shorter
            than 32 bytes, is a pattern, is hex digits without ``hex:``, or is the demo's
            key and `allow_demo_key` is False.
    """
    raw = (os.environ if environ is None else environ).get(env_name, "").strip()
    if not raw:
        raise KeyProblem(
            f"the checkpoint key is not set: put the key your workers use in ${env_name} "
            "(hex:..., base64:... or a plain string of 32+ bytes), or name another variable with --key-env"
        )
    try:
        return parse_keys(raw, source=f"${env_name}", allow_public=allow_demo_key)
    except PublicKeyRefused as exc:
        hint = f"to look at the demo's runs, add --allow-demo-key (or set {ALLOW_DEMO_KEY_ENV}=1)"
        raise KeyProblem(f"{exc}; {hint}") from None
    except ValueError as exc:
        raise KeyProblem(str(exc)) from None


def key_ids(keys: list[bytes]) -> list[str]:
    """Return the public ids of `keys` (what rows name; safe to show)."""
    return [key_id(key) for key in keys]
