"""What the worker of `bench.worker_memory` imports: two flows, and a probe that writes each process's memory.

``AGENTFLOW_APP=bench._memory_probe:app`` gives the worker two flows:

- ``chain10`` (`bench._celery_apps`): 10 supersteps of a trivial tool, then done;
- ``nap``: one `Wait` of an hour (the run pauses with a signed timer), then the same tool.

The probe (on when ``AGENTFLOW_PROBE_DIR`` is set; the worker imports this module with
``--include`` when it runs another app) runs in each pool process, counting the tasks it
ran (connected by ``worker_process_init``, which the solo pool sends too), and in the
prefork worker's main process, counting the tasks it received (not under
``AGENTFLOW_PROBE_SOLO``). Every ``AGENTFLOW_PROBE_EVERY`` tasks it appends one JSON line
to ``<AGENTFLOW_PROBE_DIR>/<pid>.jsonl``: the RSS before and after a full collection and
what that collection freed (by type, with ``AGENTFLOW_PROBE_GARBAGE``), glibc's heap
counters (``mallinfo2``), CPython's small-object arenas (``sys._debugmallocstats``), the
object counts by type that grew most since the first line, and, with
``AGENTFLOW_PROBE_TRACE`` (tracemalloc, 8 frames), the allocation sites that grew most.
The line's own full collection frees what a worker would otherwise keep until the next
one: read ``rss_kib`` (before it) over lines far apart.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from celery.signals import task_postrun, task_received, worker_init, worker_process_init
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Wait
from bench._celery_apps import chain, registry


class Nap(BaseModel):
    """The state of a run that waits an hour."""

    n: int = 0
    seconds: float = 3600.0


nap = (
    Flow("nap", state=Nap)
    .node("sleep", Wait(seconds=lambda s: s.seconds))
    .node("wake", Call("bump", args=lambda s: {"n": s.n}, into="n"))
    .edge("sleep", "wake")
    .end("wake")
)
app = FlowApp(registry, [chain, nap])


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _mallinfo() -> dict[str, int]:
    """glibc's heap counters: ``arena`` (bytes the heaps hold), ``used``, ``free`` and ``mmapped``."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"arena": info.arena, "used": info.uordblks, "free": info.fordblks, "mmapped": info.hblkhd}


def _pymalloc() -> dict[str, int]:
    """CPython's small-object allocator: arenas held now, and the bytes in use and free in them."""
    import tempfile

    with tempfile.TemporaryFile("w+") as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()
    found = {}
    for key, label in (
        ("arenas", "# arenas allocated current"),
        ("in_use", "# bytes in allocated blocks"),
        ("free", "# bytes in available blocks"),
        ("highwater", "# arenas highwater mark"),
    ):
        for line in text.splitlines():
            if line.startswith(label):
                found[key] = int(line.split("=")[-1].replace(",", "").strip())
    return found


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def _cyclic_garbage() -> list[Any]:
    """The objects a full collection would free now (found with DEBUG_SAVEALL, then let go)."""
    if os.environ.get("AGENTFLOW_PROBE_GARBAGE") is None:
        return []
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return found


class _Probe:
    def __init__(self, out: Path, every: int, trace: bool) -> None:
        self.out, self.every, self.trace = out, every, trace
        self.tasks = 0
        self.role = "tasks"
        self.by_name: Counter[str] = Counter()
        self.types0: Counter[str] | None = None
        self.snap0: tracemalloc.Snapshot | None = None
        if trace:
            tracemalloc.start(8)

    def after(self, task: Any = None, **_: Any) -> None:
        self.tasks += 1
        self.by_name[getattr(task, "name", "?")] += 1
        if self.tasks % self.every == 0:
            self.write()

    def write(self) -> None:
        rss_before_gc = _status("VmRSS")
        stats = gc.get_stats()
        garbage = Counter(type(o).__name__ for o in _cyclic_garbage())
        collected = gc.collect()
        types = Counter(type(o).__name__ for o in gc.get_objects())
        if self.types0 is None:
            self.types0 = types
        grown = Counter({k: v - self.types0.get(k, 0) for k, v in types.items()})
        line: dict[str, Any] = {
            "tasks": self.tasks,
            "role": self.role,
            "by_name": dict(self.by_name),
            "rss_kib": rss_before_gc,
            "rss_after_gc_kib": _status("VmRSS"),
            "gc_collected": collected,
            "gc_stats": stats,
            "garbage": garbage.most_common(15),
            "blocks": sys.getallocatedblocks(),
            "objects": sum(types.values()),
            "malloc": _mallinfo(),
            "pymalloc": _pymalloc(),
            "types_grown": grown.most_common(12),
        }
        if self.trace:
            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            if self.snap0 is None:
                self.snap0 = snap
            diffs = snap.compare_to(self.snap0, "traceback")[:10]
            line["traced_kib"] = tracemalloc.get_traced_memory()[0] // 1024
            line["sites"] = [
                {"kib": d.size_diff // 1024, "count": d.count_diff, "where": d.traceback.format(limit=8)} for d in diffs
            ]
        with open(self.out / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")


def _probe() -> _Probe | None:
    where = os.environ.get("AGENTFLOW_PROBE_DIR")
    if not where:
        return None
    every = int(os.environ.get("AGENTFLOW_PROBE_EVERY", "100"))
    return _Probe(Path(where), every, bool(os.environ.get("AGENTFLOW_PROBE_TRACE")))


def _in_pool_child(**_: Any) -> None:
    probe = _probe()
    if probe is not None:
        task_postrun.connect(probe.after, weak=False)
        probe.write()  # the first line: before any task


def _in_main(**_: Any) -> None:
    """The prefork worker's main process (the consumer): a line every `every` tasks received."""
    probe = _probe()
    if probe is not None:
        probe.role = "main"
        task_received.connect(lambda request=None, **_: probe.after(request), weak=False)
        probe.write()


def _cheap_tracebacks() -> None:
    """Diagnostic only: billiard's copy of a traceback keeps no code positions (what an `Ignore` costs)."""
    import importlib

    einfo: Any = importlib.import_module("billiard.einfo")
    copy = einfo._Code.__init__

    def without_positions(self: Any, code: Any) -> None:
        copy(self, code)
        self._co_positions = []

    einfo._Code.__init__ = without_positions


if os.environ.get("AGENTFLOW_PROBE_CHEAP_EINFO"):
    _cheap_tracebacks()
worker_process_init.connect(_in_pool_child, weak=False)  # the solo pool sends it too, in its one process
if not os.environ.get("AGENTFLOW_PROBE_SOLO"):
    worker_init.connect(_in_main, weak=False)
