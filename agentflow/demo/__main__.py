"""``python -m agentflow.demo [FOLDER] [--embedded|--distributed]``: run the crash-and-recovery story.

By default the story runs over Celery worker processes on Redis when Redis at
``AGENTFLOW_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) answers a ping within 1 s and
the ``celery`` extra is installed; otherwise embedded, with no server. The first line of the
output says which mode runs, and why.
"""

from __future__ import annotations

import argparse
import sys
from importlib.util import find_spec
from pathlib import Path


def _why_not_distributed() -> str | None:
    """Why the distributed story cannot run here, or None if it can."""
    if any(find_spec(name) is None for name in ("celery", "redis", "pydantic_settings")):
        return "the celery extra is not installed: pip install 'agentflow[celery]'"
    from agentflow.demo._celery import redis_url
    from agentflow.demo.distributed import unavailable

    return unavailable(redis_url())


def main(argv: list[str]) -> int:
    """Pick the mode, tell the story, return its exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m agentflow.demo",
        description="Run the crash-and-recovery story (distributed when Redis answers, else embedded).",
    )
    parser.add_argument("folder", nargs="?", type=Path, default=Path("demo-runs"), help="where the demo's files go")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--embedded", action="store_true", help="SQLite and local worker processes, no server")
    mode.add_argument("--distributed", action="store_true", help="Celery workers on Redis (AGENTFLOW_REDIS_URL)")
    opts = parser.parse_args(argv)
    if opts.embedded:
        from agentflow.demo import story

        return story.main(opts.folder, "--embedded was given")
    why_not = _why_not_distributed()
    if why_not is not None:
        if opts.distributed:
            parser.exit(2, f"agentflow demo: --distributed cannot run: {why_not}\n")
        from agentflow.demo import story

        return story.main(opts.folder, why_not)
    from agentflow.demo import distributed

    return distributed.main(opts.folder, "--distributed was given" if opts.distributed else "it answered a ping")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
