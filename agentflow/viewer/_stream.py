"""``GET /runs/{run_id}/events``: a run's event stream as server-sent events, for the run page's live list.

Each stored event (`agentflow.exec.run.events`, every one checked under the viewer's key
ring) goes out as ``id: <cursor>``, ``event: <name>`` and ``data: <one line of JSON>``
(``name``, ``at``, ``data``; every string as the page shows it, through `visible`). A
stored event that does not check goes out as ``event: problem`` with its message, never
its data. A browser that reconnects sends ``Last-Event-ID`` and gets the events after it.

The stream follows the run (`follow_events`, polling the store; it never holds the run's
lease), sends a comment every `KEEPALIVE_S` seconds while nothing happens, and ends with
``event: end`` once the run has ended and its last events are sent (the page then stops
reconnecting). It stops when the client goes, or when the server shuts down (without
``end``: a browser reconnects to the next viewer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from agentflow._errors import CheckpointError
from agentflow.exec.run.events import RunEvent, follow_events, read_events
from agentflow.viewer._settings import SECURITY_HEADERS, Viewer, visible

log = logging.getLogger("agentflow.viewer")

#: Seconds between comment lines while no event comes (proxies close a silent connection).
KEEPALIVE_S: Final = 15.0
#: How often a stream checks that its client is still there and the server is not shutting down.
TICK_S: Final = 0.25
#: How long a browser waits before it reconnects after the stream broke off (milliseconds).
RETRY_MS: Final = 3000
#: Event names the stream sends as they are; any other name goes out as a problem (it could break the framing).
_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def shown(value: Any) -> Any:
    """`value` with every string in it (keys too) as the page shows it (`visible`)."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {str(visible(str(k))): shown(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [shown(v) for v in value]
    return value


def _line(text: str) -> str:
    """`text` fit for one field line (no line break, no NUL: they would end or spoil the field)."""
    return re.sub(r"[\r\n\x00]", " ", text)


def frame(event: RunEvent) -> str:
    """One server-sent event: the cursor as its id, its name, its body as one line of JSON."""
    head = f"id: {_line(event.cursor)}\n"
    if event.problem is not None:
        return head + "event: problem\ndata: " + json.dumps({"problem": shown(event.problem)}) + "\n\n"
    if not _NAME.fullmatch(event.name):
        problem = f"event {event.cursor} has a name that cannot be sent"
        return head + "event: problem\ndata: " + json.dumps({"problem": problem}) + "\n\n"
    body = json.dumps({"name": event.name, "at": event.at, "data": shown(event.data)}, default=str)
    return head + f"event: {event.name}\ndata: {body}\n\n"


def _problem(message: str) -> str:
    return "event: problem\ndata: " + json.dumps({"problem": shown(message)}) + "\n\n"


END: Final = 'event: end\ndata: {"end": true}\n\n'
KEEPALIVE: Final = ": keep-alive\n\n"


async def _next(events: AsyncIterator[RunEvent]) -> RunEvent | None:
    try:
        return await anext(events)
    except StopAsyncIteration:
        return None


async def _stream(viewer: Viewer, request: Request, run_id: str, after: str | None) -> AsyncIterator[str]:
    """The frames of the run's events after `after`, until the run ends, the client goes, or the server stops."""
    loop = asyncio.get_running_loop()
    events = follow_events(viewer.settings.store, viewer.sealer, run_id, after)
    pending: asyncio.Task[RunEvent | None] | None = None
    quiet_since = loop.time()
    why = "the client went away"
    try:
        yield f"retry: {RETRY_MS}\n\n"
        while True:
            if pending is None:
                pending = asyncio.ensure_future(_next(events))
            done, _ = await asyncio.wait({pending}, timeout=TICK_S)
            if not done:
                if viewer.closing or await request.is_disconnected():
                    why = "the server is stopping" if viewer.closing else why
                    return
                if loop.time() - quiet_since >= KEEPALIVE_S:
                    quiet_since = loop.time()
                    yield KEEPALIVE
                continue
            task, pending = pending, None
            event = task.result()
            if event is None:
                why = "the run ended"
                yield END
                return
            quiet_since = loop.time()
            yield frame(event)
    except CheckpointError as exc:  # the store went away: the browser reconnects after RETRY_MS
        why = f"the store cannot be read: {exc}"
        log.warning("event stream of run %r broke off: %s", run_id, exc, extra={"run_id": run_id})
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, CheckpointError):
                await pending
        if isinstance(events, AsyncGenerator):
            await events.aclose()
        log.debug("event stream of run %r closed: %s", run_id, why, extra={"run_id": run_id})


async def event_stream(viewer: Viewer, request: Request, run_id: str) -> Response:
    """The run's events from after ``Last-Event-ID`` (or ``?after=``), as server-sent events.

    The run must be one the run page shows (404 unknown, 503 unreadable). A run whose rows
    fail their check shows nothing of itself here either: its stream is one problem per
    failed check, then ``end``. A cursor this store never gave is a 400.
    """
    report = await viewer.read(request, run_id)
    if isinstance(report, Response):
        return report
    after = request.headers.get("last-event-id") or request.query_params.get("after") or None
    if report.corrupt:
        body: AsyncIterator[str] | str = "".join([*(_problem(p) for p in report.problems), END])
    else:
        try:
            await read_events(viewer.settings.store, viewer.sealer, run_id, after, limit=1)
        except ValueError:
            return viewer.problem(request, 400, "Not a cursor", "That event id is not one of this store's.", run_id)
        except CheckpointError as exc:
            return viewer.problem(request, 503, "The store cannot be read", str(exc), run_id)
        body = _stream(viewer, request, run_id, after)
    headers = SECURITY_HEADERS | {"X-Accel-Buffering": "no"}
    if isinstance(body, str):
        return Response(body, media_type="text/event-stream", headers=headers)
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)
