"""Terminal output: aligned tables, status colours, and `echo`, the only way text leaves the CLI.

Plain values are written by `agentflow._display`. Every string read from a store goes
through `printable` where the text is built (`table` and `paint` do it for their cells),
so a value cannot break a line or carry a control character; `echo` then escapes any
control character left in the whole text but the line breaks and the colours `paint` wrote.
A spinner's line (`redraw`, `erase_line`, on stderr) is escaped the same way; only the
carriage return and the erase-to-end-of-line that redraw it in place are written as such.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from typing import Final

import click

from agentflow._display import printable

#: Terminal colour of each status and mark (dropped when the output is not a terminal).
COLOURS: Final = {
    "done": "green",
    "running": "blue",
    "paused": "yellow",
    "failed": "red",
    "corrupt": "red",
    "CORRUPT": "red",
    "in doubt": "magenta",
    "waiting for a decision": "magenta",
    "live": "blue",
    "held": "blue",
    "recovered": "cyan",
    "resumed": "cyan",
    "replayed": "cyan",
    "pending": "yellow",
    "denied": "red",
    "PROBLEM": "red",
    "GAP": "red",
}

#: Moves the cursor back to the start of the line and erases the line: how a spinner's line is redrawn.
ERASE_LINE: Final = "\r\x1b[K"

#: The escape sequences `paint` writes (``click.style`` with a foreground colour and bold or
#: not); `echo` lets these through and no other.
STYLES: Final = re.compile(r"\x1b\[(?:3[0-7]|1|22|0)m")


def paint(text: str, word: str | None = None) -> str:
    """Colour `text` (escaped with `printable`) by the status or mark `word` (by default, `text` itself)."""
    colour = COLOURS.get(word if word is not None else text)
    text = printable(text)
    return click.style(text, fg=colour, bold=colour == "red") if colour else text


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], colour: int | None = None) -> str:
    """Align `rows` (each cell escaped with `printable`) under `headers`; column `colour` is painted by its value."""
    cells_of = [[printable(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells_of:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in cells_of:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=True)]
        if colour is not None:
            cells[colour] = paint(cells[colour], row[colour].split(":")[0].split(",")[0].strip())
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def terminal_safe(text: str) -> str:
    """Escape every control character of `text` but its line breaks and the colours `paint` wrote."""
    parts: list[str] = []
    at = 0
    for style in STYLES.finditer(text):
        parts += [printable(text[at : style.start()], keep="\n"), style.group()]
        at = style.end()
    parts.append(printable(text[at:], keep="\n"))
    return "".join(parts)


def echo(text: str, *, err: bool = False) -> None:
    """Write `text` and a line break to stdout (or stderr), through `terminal_safe`."""
    click.echo(terminal_safe(text), err=err)


def redraw(text: str) -> None:
    """Write `text` over stderr's current line (a spinner's), cut to the terminal's width, with no line break.

    `text` is escaped whole (`printable`): it carries no colour, so the cut cannot split one.
    """
    width = max(shutil.get_terminal_size().columns - 1, 10)
    line = printable(text)
    cut = line if len(line) <= width else line[: width - 1] + "…"
    click.echo(ERASE_LINE + cut, err=True, nl=False, color=True)  # only called on a terminal: keep the erase


def erase_line() -> None:
    """Erase stderr's current line (a spinner's), leaving the cursor at its start."""
    click.echo(ERASE_LINE, err=True, nl=False, color=True)
