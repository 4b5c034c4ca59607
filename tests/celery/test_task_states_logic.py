"""The tasks a later task settles in Flower (`agentflow.celery._task_states`), on one in-process worker.

What the settling worker sends is recorded instead of sent: the tasks, their state and result,
and the node name the Flower event goes under. Real workers and a real Flower are in
test_flower_workers.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from worker_kit import Died, Setup

from agentflow.celery import _tasks
from agentflow.celery._task_states import lost_on, settle

Settled = tuple[dict[str, dict[str, Any]], str, str | None]


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> list[Settled]:
    """What the task bodies settle: ``(results by task id, state, node)`` each time."""
    seen: list[Settled] = []

    def record(app: Any, results: Mapping[str, dict[str, Any]], state: str, node: str | None) -> None:
        if results:
            seen.append((dict(results), state, node))

    monkeypatch.setattr(_tasks, "settle", record)
    return seen


def _request(task_id: str) -> SimpleNamespace:
    """What a task body reads of the Celery task it runs in, on worker w2."""
    request = SimpleNamespace(id=task_id, hostname="w2@host", delivery_info={}, retries=0)
    return SimpleNamespace(request=request, app=None)


async def _waiting_on_approval(s: Setup, run_id: str) -> None:
    """A wires run paused for its approval, whose asking task ``task-ask`` left its note."""
    step = await s.start("wires", run_id)
    assert (await s.worker.superstep("wires", run_id, step, handoff=True)).status == "paused"
    await s.worker.asked(run_id, "task-ask", "PAUSED")


async def test_a_mark_answered_message_about_a_run_that_still_waits_moves_nothing(
    s: Setup, settled: list[Settled]
) -> None:
    # Given a run paused for an approval, its asking task noted
    await _waiting_on_approval(s, "r1")
    # When a mark_answered message about it comes (sent by mistake, or forged)
    result = await asyncio.to_thread(s.tasks.run_mark_answered, _request("task-m"), "r1")
    # Then nothing is settled and the note stays, for the task that will spend the answer
    assert (result, settled) == ({"run_id": "r1", "answered": []}, [])
    assert await s.worker.answered("r1") == ["task-ask"]


async def test_a_mark_answered_message_about_a_cancelled_run_answers_its_question_as_its_worker(
    s: Setup, settled: list[Settled]
) -> None:
    # Given a run paused for an approval, then cancelled by a client
    await _waiting_on_approval(s, "r1")
    await s.worker.runner.cancel(s.app.flow("wires"), "r1", reason="not wanted")
    # When the worker w2 takes the client's mark_answered message
    result = await asyncio.to_thread(s.tasks.run_mark_answered, _request("task-m"), "r1")
    # Then the asking task is ANSWERED, its event sent under w2's own node name
    assert result == {"run_id": "r1", "answered": ["task-ask"]}
    assert settled == [({"task-ask": {"run_id": "r1", "answered_by": "cancel"}}, "ANSWERED", "w2@host")]
    assert await s.worker.answered("r1") == []  # the note is spent: a second message moves nothing


async def test_a_recovery_marks_the_task_cut_off_lost_naming_the_worker_it_ran_on(
    s: Setup, settled: list[Settled]
) -> None:
    # Given a mail run whose worker died inside `send`, in the superstep of task ``task-1``
    s.die = True
    step = await s.start("mail", "r1")
    with pytest.raises(Died):
        await s.worker.superstep("mail", "r1", step, handoff=True, message="task-1")
    # When the worker w2 takes a recovery that parks the run on the call in doubt
    request = _request("task-recover")
    outcome = await s.worker.superstep("mail", "r1", step, handoff=False, cause="recover", message="task-recover")
    assert outcome.done == "decision", outcome
    await asyncio.to_thread(s.tasks.settle_earlier, request, outcome, "recover")
    # Then task-1 is LOST, its result naming the worker and process its lease named, the event sent under w2's name
    node, pid = s.worker.owner.rsplit(":", 1)
    lost = {"run_id": "r1", "recovered_by": "task-recover", "lost_on": node, "lost_pid": int(pid)}
    assert settled == [({"task-1": lost}, "LOST", "w2@host")]


@pytest.mark.parametrize(
    ("holder", "said"),
    [
        ("w1@host:4242", {"lost_on": "w1@host", "lost_pid": 4242}),
        ("in-process-runner", {"lost_on": "in-process-runner"}),  # a holder named without a pid
        (None, {}),  # its started records name no holder
    ],
)
def test_a_lost_tasks_result_names_the_worker_and_process_it_was_lost_with(
    holder: str | None, said: dict[str, Any]
) -> None:
    assert lost_on(holder) == said


def test_a_settle_outside_a_worker_sends_no_flower_event_under_an_anonymous_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given an app whose result backend and event dispatcher are recorded
    app = Celery("settle-outside")
    stored: list[tuple[str, str]] = []
    monkeypatch.setattr(app.backend, "store_result", lambda task_id, result, state: stored.append((task_id, state)))
    dispatched: list[Any] = []
    monkeypatch.setattr(app.events, "default_dispatcher", lambda **kw: dispatched.append(kw))
    # When a task is settled with no node name (a task body run outside a worker)
    settle(app, {"t1": {"run_id": "r1"}}, "ANSWERED", None)
    # Then the backend has its state, and no event goes out under Celery's gen<pid>@host
    assert (stored, dispatched) == ([("t1", "ANSWERED")], [])
