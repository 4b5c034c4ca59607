"""Waiting for a condition: the one poll loop the tests share (no test sleeps on a guessed time).

`until(check, what)` calls `check` (sync or async) every `every` seconds until it returns
something truthy, and returns that; after `timeout_s` it fails naming `what`.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def until(
    check: Callable[[], Awaitable[T | None]], what: str, *, timeout_s: float = ..., every: float = ...
) -> T: ...


@overload
async def until(check: Callable[[], T | None], what: str, *, timeout_s: float = ..., every: float = ...) -> T: ...


async def until(check: Callable[[], Any], what: str, *, timeout_s: float = 10.0, every: float = 0.02) -> Any:
    """Poll `check` (sync or async) until it returns something truthy; return it.

    Raises:
        AssertionError: it did not within `timeout_s` (the message names `what`).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        value = await found if inspect.isawaitable(found) else found
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        await asyncio.sleep(every)
