"""Every ```python block in docs/ and the README's runnable ones are executed.

Each block is a complete program, run in its own process from a temporary folder. A
```text block right after a paragraph ending "It prints:" must equal the output of the
python block before it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)


def blocks() -> list[tuple[str, int, str, str | None]]:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        fences = list(FENCE.finditer(text))
        for i, match in enumerate(fences):
            if match.group(1) != "python":
                continue
            expected = None
            if i + 1 < len(fences) and fences[i + 1].group(1) == "text":
                between = text[match.end() : fences[i + 1].start()]
                if between.strip().endswith("It prints:"):
                    expected = fences[i + 1].group(2)
            line = text[: match.start()].count("\n") + 1
            found.append((page.name, line, match.group(2), expected))
    return found


@pytest.mark.parametrize(("page", "line", "code", "expected"), blocks(), ids=lambda v: str(v)[:30])
def test_docs_example_runs_as_written(tmp_path, page, line, code, expected):
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{page}:{line} failed:\n{proc.stderr}"
    if expected is not None:
        assert proc.stdout == expected, f"{page}:{line} printed something else"


def test_every_page_with_code_is_covered():
    # A guard against the extractor silently finding nothing
    assert any(page == "durable-runs.md" for page, *_ in blocks())
