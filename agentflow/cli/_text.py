"""Terminal output: aligned tables and status colours (plain values are written by `agentflow._display`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import click

#: Terminal colour of each status and mark (dropped when the output is not a terminal).
COLOURS: Final = {
    "done": "green",
    "running": "blue",
    "paused": "yellow",
    "failed": "red",
    "corrupt": "red",
    "CORRUPT": "red",
    "in doubt": "magenta",
    "recovered": "cyan",
    "resumed": "cyan",
    "replayed": "cyan",
    "pending": "yellow",
    "denied": "red",
}


def paint(text: str, word: str | None = None) -> str:
    """Colour `text` by the status or mark `word` (by default, `text` itself)."""
    colour = COLOURS.get(word if word is not None else text)
    return click.style(text, fg=colour, bold=colour == "red") if colour else text


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], colour: int | None = None) -> str:
    """Align `rows` under `headers`; column `colour` is painted by its own value."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=True)]
        if colour is not None:
            cells[colour] = paint(cells[colour], row[colour].split(":")[0].split(",")[0].strip())
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
