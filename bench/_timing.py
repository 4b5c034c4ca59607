"""Timing: interleaved measurement of several cases, and `Series` of per-block figures.

The machine is shared and noisy, so comparisons are never made between two separate
loops run minutes apart. `interleave` runs the cases round-robin, one call each in turn
(the starting case rotating), times every call on its own, and groups the calls into
blocks. A block's figure for a case is the median of its calls, so a burst of load from
another process lands on every case alike and a single preempted call moves nothing.
Derived figures (an overhead: with store minus without; a ratio of two overheads) are
computed block by block, so their spread is visible as min..max over the blocks.
"""

from __future__ import annotations

import gc
import inspect
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: A case: a callable that does one unit of work (sync, or returning an awaitable).
Case = Callable[[], Any]


@dataclass(frozen=True)
class Series:
    """One figure measured in several blocks (repetitions); seconds unless said otherwise."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Series:
        return cls(tuple(values))

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    def __sub__(self, other: Series | float) -> Series:
        if isinstance(other, Series):
            return Series(tuple(a - b for a, b in zip(self.values, other.values, strict=True)))
        return Series(tuple(a - other for a in self.values))

    def __truediv__(self, other: Series | float) -> Series:
        if isinstance(other, Series):
            return Series(tuple(a / b if b else float("inf") for a, b in zip(self.values, other.values, strict=True)))
        return Series(tuple(a / other for a in self.values))

    def __mul__(self, factor: float) -> Series:
        return Series(tuple(a * factor for a in self.values))

    def ratio(self, other: Series) -> Series:
        """Block-by-block ratio self/other (the blocks were measured side by side)."""
        return self / other

    def as_json(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.lo, "max": self.hi, "blocks": list(self.values)}


@dataclass(frozen=True)
class Plan:
    """How many calls to make: warm-up calls per case, then `blocks` blocks of `per_block` calls per case."""

    warmup: int
    blocks: int
    per_block: int


async def _call(case: Case) -> None:
    out = case()
    if inspect.isawaitable(out):
        await out


async def interleave(
    cases: Mapping[str, Case],
    plan: Plan,
    *,
    between: Callable[[], Awaitable[None] | None] | None = None,
) -> dict[str, Series]:
    """Time every case round-robin and return each case's per-call median, block by block.

    Args:
        cases: name -> one unit of work.
        plan: warm-up and block sizes.
        between: called (untimed) after every block, e.g. to empty an in-memory store.
    """
    names = list(cases)
    for _ in range(plan.warmup):
        for name in names:
            await _call(cases[name])
    per_block: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter
    for _ in range(plan.blocks):
        gc.collect()
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(plan.per_block):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                case = cases[name]
                start = clock()
                out = case()
                if inspect.isawaitable(out):
                    await out
                samples[name].append(clock() - start)
        for name in names:
            per_block[name].append(statistics.median(samples[name]))
        if between is not None:
            done = between()
            if inspect.isawaitable(done):
                await done
    return {name: Series.of(values) for name, values in per_block.items()}


async def repeat(case: Case, *, warmup: int, times: int) -> Series:
    """Time `times` calls of one case (after `warmup` untimed ones); one block per call."""
    for _ in range(warmup):
        await _call(case)
    values = []
    for _ in range(times):
        gc.collect()
        start = time.perf_counter()
        await _call(case)
        values.append(time.perf_counter() - start)
    return Series.of(values)


def fmt_time(seconds: float) -> str:
    """Format a duration with a unit that keeps three significant figures readable."""
    us = seconds * 1e6
    if abs(us) < 1000:
        return f"{us:.0f} µs" if abs(us) >= 100 else f"{us:.1f} µs"
    if abs(us) < 1e6:
        return f"{us / 1000:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_span(series: Series, fmt: Callable[[float], str] = fmt_time) -> str:
    """``median (min..max)`` of a series."""
    return f"{fmt(series.median)} ({fmt(series.lo)}..{fmt(series.hi)})"


def fmt_ratio(series: Series) -> str:
    return f"{series.median:.2f}x ({series.lo:.2f}..{series.hi:.2f})"
