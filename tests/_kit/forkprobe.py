"""A kit script for the fork server's own tests (test_forkserver.py): it says what a child sees, or ends as asked.

Actions: ``report`` (its pid, randomness, open files, cwd, argv and ``FORKPROBE``, as JSON),
``kill`` (SIGKILL to itself), ``fail`` (an exception), ``exit CODE``, ``block PIDFILE``
(writes its pid, then waits forever), ``talk GATE`` (prints ``hello PID``, waits until the
file GATE exists, prints ``bye``). It imports only the standard library, so its server starts at once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path


def open_fds() -> list[int]:
    """The file descriptors open in this process (Linux), without the one that lists them."""
    listed = [int(fd) for fd in os.listdir("/proc/self/fd")]
    open_now = []
    for fd in listed:
        try:
            os.fstat(fd)
        except OSError:
            continue
        open_now.append(fd)
    return sorted(open_now)


def main(argv: list[str]) -> None:
    action, *rest = argv
    if action == "report":
        seen = {
            "pid": os.getpid(),
            "random": random.random(),
            "urandom": os.urandom(8).hex(),
            "fds": open_fds(),
            "cwd": os.getcwd(),
            "argv": sys.argv,
            "env": os.environ.get("FORKPROBE"),
        }
        print("a line before the outcome")
        print(json.dumps(seen), flush=True)
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "fail":
        raise RuntimeError("the probe failed as asked")
    elif action == "exit":
        sys.exit(int(rest[0]))
    elif action == "block":
        Path(rest[0]).write_text(str(os.getpid()))
        threading.Event().wait()
    elif action == "talk":
        print(f"hello {os.getpid()}", flush=True)
        while not Path(rest[0]).exists():
            time.sleep(0.005)
        print("bye", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
