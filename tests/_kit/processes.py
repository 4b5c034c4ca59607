"""Child processes of the tests: one worker process of a crash kit, and children that Ctrl-C must reach.

A kit script (tests/crash, tests/loop, tests/agent) runs or recovers one run, may SIGKILL itself
at a boundary, and prints its outcome as JSON on its last line of stdout; a killed process prints
nothing.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _kit.specs import child_env


def run_kit(script: Path, *args: str, timeout_s: float = 60.0) -> dict[str, Any] | None:
    """Run `script` with `args` (tests/ on ``PYTHONPATH``, in its folder); its JSON outcome, None if it was killed.

    Raises:
        AssertionError: the process failed otherwise (its stderr is in the message).
    """
    cmd = [sys.executable, str(script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=script.parent, env=child_env())
    if proc.returncode == -signal.SIGKILL:
        return None
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


@contextlib.contextmanager
def ctrl_c_reaches_children() -> Iterator[None]:
    """Children started in the block take SIGINT as a terminal's foreground process does: it stops them.

    An ignored signal stays ignored across exec, and something in a full test session leaves
    SIGINT ignored in a pytest worker (a follower under test then never saw its Ctrl-C). A
    handled one is reset to the default: so SIGINT is handled here while the block runs.
    """
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
