"""Logs of a run at DEBUG: no key, principal or password in any line; the lines about a run carry its id.

A JSON formatter shows every attribute of a record (as python-json-logger and the like do),
so a field passed with ``extra=`` reaches the user's log pipeline, and so would a secret
passed in one.
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from collections.abc import Iterator

import pytest
import redis.asyncio
from _kit.poll import until
from _kit.secrets import leaks, redis_user
from _kit.stores import _remove_redis_keys
from _kit.tickets import TICKETS, Crash, make_tickets

from agentflow import Event, Events, Executor, FlowRunner, RunContext
from agentflow.exec.checkpoints import RedisCheckpointStore
from agentflow.exec.run.cancel import KIND
from agentflow.exec.run.lease import Ownership, holding
from agentflow.exec.run.markers import key_of

pytestmark = [pytest.mark.redis]


class JsonLines(logging.Handler):
    """Keeps every record, and each as the JSON line a structured formatter would write."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = {**record.__dict__, "message": record.getMessage()}
        if record.exc_info:
            fields["exc_info"] = logging.Formatter().formatException(record.exc_info)
        self.records.append(record)
        self.lines.append(json.dumps(fields, default=repr))


@pytest.fixture
def captured() -> Iterator[JsonLines]:
    handler = JsonLines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


def _failing_subscriber(event: Event) -> None:
    if event.name == "tool.rerun":
        raise RuntimeError("a subscriber that breaks")


async def test_a_debug_run_logs_no_secret_and_each_line_about_it_carries_its_run_id(redis_url, captured):
    key = secrets.token_bytes(32)
    principal = "token-" + secrets.token_hex(12)
    prefix = f"t{uuid.uuid4().hex[:12]}"
    run_id = f"{prefix}-run"
    with redis_user(redis_url) as (url, password):
        store = RedisCheckpointStore(lambda: redis.asyncio.Redis.from_url(url), prefix=prefix)
        try:
            # Given a run for a principal on Redis (logged in with a password), whose worker died after
            # charge_card's effect, and a subscriber that fails on the events of its recovery
            tickets = make_tickets()
            tickets.crash_in.add("charge_card")
            events = Events()
            events.subscribe(_failing_subscriber)
            runner = FlowRunner(Executor(tickets.registry, events=events), checkpoints=store, checkpoint_key=key)
            ctx = RunContext(user="alice", thread="t1", principal=principal)
            with pytest.raises(Crash):
                await runner.run(TICKETS, {"show": "Hamlet"}, run_id=run_id, ctx=ctx)
            # and a cancel request that nobody signed left on the run
            await store.put_marker(key_of(KIND, run_id), "forged request", "tok", 60)
            # When the run is recovered (the call in doubt rerun) at DEBUG, and another holder loses its lease
            result = await runner.recover(TICKETS, run_id, rerun_in_doubt=True, ctx=ctx, operator="ops")
            assert result.status == "done"
            async with holding(store, f"{prefix}-other", Ownership("w@host:1", lease_s=0.09)) as held:
                await store.release_lease(f"{prefix}-other", held.lease.token)
                await _until_logged(captured, "lost its lease")
        finally:
            await store.aclose()
            _remove_redis_keys(redis_url, prefix)

    # Then the key, the principal and the password appear in no line, in no form
    text = "\n".join(captured.lines)
    assert leaks(text, [("key", key), ("principal", principal), ("password", password)]) == []
    assert leaks(text + key.hex(), [("key", key)]) == ["key"]  # (the search does find one)
    # and every agentflow line about a run carries the run's id as a field (the one line about the
    # server, that this machine's Redis keeps nothing on disk, comes once per process: it is left out)
    ours = [
        r for r in captured.records if r.name.startswith("agentflow") and "keeps nothing on disk" not in r.getMessage()
    ]
    assert {(r.name, getattr(r, "run_id", None)) for r in ours} == {
        ("agentflow.markers", run_id),  # the cancel request that does not check, removed
        ("agentflow.events", run_id),  # the subscriber that failed
        ("agentflow.lease", f"{prefix}-other"),  # the lease found lost
    }, [(r.name, r.getMessage(), getattr(r, "run_id", None)) for r in ours]


async def _until_logged(captured: JsonLines, words: str) -> None:
    await until(lambda: any(words in r.getMessage() for r in captured.records), f"a line saying {words!r}", timeout_s=5)
