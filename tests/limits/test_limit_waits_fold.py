"""Which waits for a limit a run's event stream leaves open (`run.waits.open_waits`)."""

from __future__ import annotations

from typing import Any

from agentflow.exec.run.events import RunEvent
from agentflow.exec.run.view import LimitWait
from agentflow.exec.run.waits import open_waits


def ev(n: int, name: str, **data: Any) -> RunEvent:
    return RunEvent(str(n), name, 100.0 + n, data)


def test_a_wait_stays_open_until_its_call_is_admitted_and_keeps_its_start_when_its_reason_changes():
    events = [
        ev(1, "call.waiting", tool="fetch", call_id="1/a/0/x", limit="api", why="concurrency", wait_s=1),
        ev(2, "call.waiting", tool="fetch", call_id="1/a/1/y", limit="api", why="rate", wait_s=1),
        ev(3, "call.admitted", tool="fetch", call_id="1/a/1/y", waited_s=0.5),
        ev(4, "tool.started", tool="fetch", call_id="1/a/1/y", attempt=1),
        ev(5, "call.waiting", tool="fetch", call_id="1/a/0/x", limit="api", why="closed", wait_s=2),
        ev(6, "call.waiting", model="acme", call_id="2/model", limit="acme", why="rate", wait_s=1),
    ]

    assert open_waits(events) == [
        LimitWait("1/a/0/x", "fetch", "api", "closed", 101.0),
        LimitWait("2/model", "model acme", "acme", "rate", 106.0),
    ]


def test_a_saved_step_or_a_new_holder_closes_every_wait_and_a_forged_event_says_nothing():
    waiting = ev(1, "call.waiting", tool="fetch", call_id="1/a/0/x", limit="api", why="concurrency", wait_s=1)
    for boundary in ("checkpoint.saved", "run.recovered", "lease.lost", "run.finished"):
        assert open_waits([waiting, ev(2, boundary)]) == []
    forged = RunEvent("3", "", problem="event 3 of run 'r' does not check")
    assert open_waits([forged]) == []
    assert [w.call_id for w in open_waits([waiting, forged])] == ["1/a/0/x"]
