"""Child processes of the tests: one worker process of a crash kit, and children that Ctrl-C must reach.

A kit script (tests/crash, tests/loop, tests/agent) runs or recovers one run, may SIGKILL itself
at a boundary, and prints its outcome as JSON on its last line of stdout; a killed process prints
nothing. Each such process is forked from a warm server that has done the script's imports
(`_kit.forkserver`).
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _kit import forkserver


def run_kit(script: Path, *args: str, timeout_s: float = 60.0) -> dict[str, Any] | None:
    """Run `script` with `args` (tests/ on ``PYTHONPATH``, in its folder); its JSON outcome, None if it was killed.

    The process is forked from the script's warm server (`_kit.forkserver`), as ``python script args`` would run.

    Raises:
        AssertionError: the process failed otherwise (its stderr is in the message).
        subprocess.TimeoutExpired: it ran longer than `timeout_s` (it was killed).
    """
    proc = forkserver.run(script, list(args), timeout_s=timeout_s)
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
