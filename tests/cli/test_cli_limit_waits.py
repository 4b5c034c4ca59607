"""``agentflow runs show`` and the read model say which call of a live run waits for a shared limit, and since when."""

from __future__ import annotations

import runs_kit
from limit_wait_kit import waiting_run

from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.run.read import read_run
from agentflow.exec.run.view import RunReport
from agentflow.exec.seal import Sealer


def test_runs_show_says_the_call_waits_for_a_limit_and_since_when(db, agentflow):
    # Given a live run whose call waits for the one slot of limit "api", which another holder keeps
    with waiting_run(db, "post-1", runs_kit.KEY):
        # When an operator shows the run
        waiting = agentflow("runs", "show", "post-1")

    # Then it says the run is on its worker, and which call waits for which limit, why, since when
    assert waiting.exit_code == 0, waiting.output
    lines = waiting.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("running on "))
    said = lines[at + 1]
    assert said.startswith("  waiting for limit api (concurrency) since 20"), said
    assert said.endswith("not started yet") and ": post (call 0/send/0/" in said
    # and no call is listed: the waiting call has no record (it is not in doubt)
    assert "in doubt" not in waiting.output.replace("not in doubt", "")

    # When it is shown again after the slot came free and the run finished
    done = agentflow("runs", "show", "post-1")

    # Then nothing waits
    assert done.exit_code == 0 and "waiting for limit" not in done.output


def test_the_read_model_has_the_wait_of_a_live_run_only(db):
    # Given a live run whose call waits for limit "api"
    sealer = Sealer(runs_kit.KEY)

    async def read(run_id: str) -> RunReport:
        async with SQLiteCheckpointStore(db) as store:
            return await read_run(store, sealer, run_id)

    with waiting_run(db, "post-2", runs_kit.KEY):
        # When it is read
        report = runs_kit.in_thread(lambda: read("post-2"))

    # Then its wait is there: the call, its tool, the limit, why, and since when
    assert report.lease is not None
    [wait] = report.waiting_for_limit
    assert (wait.tool, wait.limit, wait.why) == ("post", "api", "concurrency")
    assert wait.call_id.startswith("0/send/0/") and wait.since <= report.lease.expires_at
    assert report.calls == [] and report.in_doubt == []

    # and once the run finished, no wait is
    assert runs_kit.in_thread(lambda: read("post-2")).waiting_for_limit == []
