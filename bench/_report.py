"""What a benchmark hands back (`Report`: tables, targets, raw data) and how it is printed and saved."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Table:
    """One printed table: a title, column headers, and rows of already formatted cells."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def text(self) -> str:
        widths = [max(len(self.columns[i]), *(len(r[i]) for r in self.rows)) for i in range(len(self.columns))]
        line = "  ".join("-" * w for w in widths)
        out = [self.title, "", "  ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True)), line]
        for row in self.rows:
            out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        if self.note:
            out += ["", self.note]
        return "\n".join(out)

    def markdown(self) -> str:
        out = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |"]
        out.append("|" + "|".join("---" for _ in self.columns) + "|")
        for row in self.rows:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        if self.note:
            out += ["", self.note]
        return "\n".join(out)


@dataclass
class Target:
    """A target of issue 8 (P0..P5) or another issue, with what this run measured."""

    name: str
    """E.g. ``P1 SQLite NORMAL``."""
    measured: float
    """The figure compared with the limit (a ratio, seconds, or bytes)."""
    limit: float
    """The target; `measured` must be at most this (or at least, with `at_least`)."""
    shown: str
    """The figure as printed, with its unit and spread."""
    wanted: str
    """The target as printed, e.g. ``<= 0.5x``."""
    at_least: bool = False

    @property
    def met(self) -> bool:
        if math.isnan(self.measured):
            return False
        return self.measured >= self.limit if self.at_least else self.measured <= self.limit


@dataclass
class Report:
    """Everything one benchmark produced."""

    name: str
    title: str
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    """Raw figures (seconds, bytes, counts) for the JSON file and the plots."""
    notes: list[str] = field(default_factory=list)
    """Skipped parts and their reasons, caveats."""

    def text(self) -> str:
        parts = [f"== {self.name}: {self.title}"]
        parts += [t.text() for t in self.tables]
        if self.targets:
            parts.append(targets_table(self.targets).text())
        parts += [f"note: {n}" for n in self.notes]
        return "\n\n".join(parts)

    def markdown(self) -> str:
        parts = [f"### {self.name}: {self.title}"]
        parts += [t.markdown() for t in self.tables]
        if self.targets:
            parts.append(targets_table(self.targets).markdown())
        parts += [f"Note: {n}" for n in self.notes]
        return "\n\n".join(parts)


def targets_table(targets: list[Target]) -> Table:
    table = Table("Targets", ["target", "measured", "wanted", "met"])
    for t in targets:
        table.add(t.name, t.shown, t.wanted, "yes" if t.met else "NO")
    return table


def _clean(value: Any) -> Any:
    """Make `value` JSON-able: dataclasses to dicts, NaN/inf to strings."""
    if hasattr(value, "as_json"):
        return _clean(value.as_json())
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def write_json(report: Report, env: dict[str, Any], path: Path) -> None:
    """Write one benchmark's results, with the machine and versions they were measured on."""
    body = {
        "benchmark": report.name,
        "title": report.title,
        "env": env,
        "targets": [{**asdict(t), "met": t.met} for t in report.targets],
        "tables": [asdict(t) for t in report.tables],
        "data": report.data,
        "notes": report.notes,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(body), indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Report:
    """Read back a report `write_json` wrote (how the suite collects a benchmark run in its own process)."""
    saved = json.loads(path.read_text())
    fields = {f for f in Target.__dataclass_fields__}
    return Report(
        saved["benchmark"],
        saved["title"],
        tables=[Table(**t) for t in saved["tables"]],
        targets=[Target(**{k: v for k, v in t.items() if k in fields}) for t in saved["targets"]],
        data=saved["data"],
        notes=saved["notes"],
    )
