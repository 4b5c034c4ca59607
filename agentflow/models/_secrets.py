"""API keys of the model adapters: checked once at construction, and scrubbed from any text quoted back.

A key is refused if it holds whitespace or a control character anywhere (a trailing newline
read from a file is the usual case): it would otherwise end up in a malformed header, and
the HTTP library's error (and its debug log) would quote the header whole.

Text a server sends back is scrubbed *before* it is shortened or reflowed: the key, its
``Bearer`` form, its URL- and JSON-escaped forms, and any run of `FRAGMENT` or more of its
characters (a server that echoes half a key) all become ``[api key]``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

#: How much of a server's text an error message quotes.
QUOTE_LIMIT = 300
#: The shortest run of a key's characters that is scrubbed on its own.
FRAGMENT = 8
_MASK = "[api key]"
_BAD = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")


def resolve_key(api_key: str | None, env_var: str, owner: str) -> str | None:
    """The key to use: `api_key`, else ``$env_var``, else none; checked with `check_key`.

    Raises:
        ValueError: the key holds whitespace or a control character (the message never shows it).
    """
    key = api_key if api_key is not None else os.environ.get(env_var) or None
    if key is not None:
        check_key(key, f"{owner}'s api_key" if api_key is not None else f"${env_var}")
    return key


def check_key(key: str, where: str) -> None:
    """Refuse a key that cannot go into a header as it is.

    Raises:
        ValueError: the key is empty, or holds whitespace or a control character.
    """
    if not key:
        raise ValueError(f"{where} is empty: leave it unset for a server that needs no key")
    if match := _BAD.search(key):
        kind = "whitespace" if match.group().isspace() else "a control character"
        raise ValueError(
            f"{where} holds {kind} at position {match.start()} of {len(key)}: keys never do, so it was "
            "probably read with a trailing newline or pasted with a space; strip it "
            "(for example key.strip()) before passing it"
        )


class Scrubber:
    """Removes known secrets from text before it goes into an error or a log line."""

    def __init__(self, secrets: Iterable[str | None]) -> None:
        keys = sorted({s for s in secrets if s}, key=len, reverse=True)
        forms: set[str] = set()
        for key in keys:
            forms |= {key, quote(key, safe=""), quote_plus(key), json.dumps(key)[1:-1]}
        self._forms = sorted(forms, key=len, reverse=True)
        self._grams = {key[i : i + FRAGMENT] for key in keys for i in range(len(key) - FRAGMENT + 1)}

    def __call__(self, text: str) -> str:
        """`text` with every form of every secret, and every long fragment of one, masked.

        For short text (a message of ours); `quote` takes a server's text of any length.
        """
        return self._fragments(self._whole(text))

    def quote(self, text: str) -> str:
        """Scrub `text`, then fold its whitespace and shorten it to `QUOTE_LIMIT` characters.

        Whole keys are masked before anything is cut, so a cut cannot leave part of one
        behind; fragments the server itself sent are masked in what is kept.
        """
        text = " ".join(self._whole(text).split())
        return self._fragments(text if len(text) <= QUOTE_LIMIT else text[:QUOTE_LIMIT] + "...")

    def _whole(self, text: str) -> str:
        for form in self._forms:
            text = text.replace(form, _MASK)
        return text

    def _fragments(self, text: str) -> str:
        if not self._grams:
            return text
        covered = [False] * len(text)
        for start in range(len(text) - FRAGMENT + 1):
            if text[start : start + FRAGMENT] in self._grams:
                covered[start : start + FRAGMENT] = [True] * FRAGMENT
        if not any(covered):
            return text
        out: list[str] = []
        for index, char in enumerate(text):
            if not covered[index]:
                out.append(char)
            elif index == 0 or not covered[index - 1]:
                out.append(_MASK)
        return "".join(out)
