"""How values are written for a person, shared by every surface (the CLI, the viewer, the demo).

Only plain formatting lives here: no colours, no terminal, no web framework, so a surface
can use it without importing another surface.

Every string read from a store (run ids, flow, node and tool names, states, arguments,
results, errors, notes, problems) is written through `printable` before it reaches a
terminal: whoever can write a tool's result or a run id must not be able to move the
cursor, clear the screen, set the window title or fake a line of output.
"""

from __future__ import annotations

import json
import unicodedata
from datetime import datetime
from typing import Any, Final

#: Unicode categories written as escapes: controls (C0, DEL, C1), lone surrogates, line and
#: paragraph separators.
ESCAPED_CATEGORIES: Final = frozenset({"Cc", "Cs", "Zl", "Zp"})
#: Bidirectional embeddings, overrides and isolates: they reorder what a terminal shows.
BIDI_CONTROLS: Final = frozenset({*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C})


def escaped(char: str) -> bool:
    """Whether `printable` writes `char` as an escape."""
    return ord(char) in BIDI_CONTROLS or unicodedata.category(char) in ESCAPED_CATEGORIES


#: Escapes written the short way.
SHORT_ESCAPES: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_char(char: str) -> str:
    r"""Write one character as a Python-style escape: ``\n``, ``\x1b``, ``\u202e`` or ``\U000e0001``."""
    if char in SHORT_ESCAPES:
        return SHORT_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str, keep: str = "") -> str:
    r"""Return `text` safe to write to a terminal: every control character written as an escape.

    C0 controls (newline and tab included), DEL, C1 controls, lone surrogates, line and
    paragraph separators and bidirectional controls become ``\x1b``, ``\u2028``, ...; so an
    ESC sequence loses its ESC and shows as text. Printable characters, non-ASCII ones
    included, are kept as they are; so are backslashes. The result holds no control
    character but those in `keep`.

    Args:
        text: the text to write.
        keep: characters to leave as they are (a surface's own line breaks, say ``"\n"``).
    """
    if text.isprintable():  # the common case: nothing to escape
        return text
    return "".join(escape_char(c) if escaped(c) and c not in keep else c for c in text)


def when(ts: float) -> str:
    """Write a save time as local ``YYYY-MM-DD HH:MM:SS``."""
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def short(value: Any, width: int = 60) -> str:
    """Write a value as compact JSON on one line, cut to `width` characters.

    A string is taken as it is; anything else is JSON with sorted keys (values JSON cannot
    encode are written with `str`). Runs of whitespace become one space, and the control
    characters that remain are written as escapes (`printable`).
    """
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = printable(" ".join(text.split()))
    return text if len(text) <= width else text[: width - 1] + "…"
