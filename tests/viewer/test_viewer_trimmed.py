"""The viewer's run page of a run that retention trimmed to its newest checkpoint: shown, and said so."""

from __future__ import annotations

import time

import runs_kit

from agentflow.exec.checkpoints import RetentionPolicy, SQLiteCheckpointStore, trim_finished
from agentflow.exec.seal import Sealer

CHECK = Sealer(runs_kit.KEY).checkpoint_problem


def test_a_trimmed_run_page_says_where_its_history_starts(db, local):
    # Given the finished runs trimmed by retention
    async def trim() -> None:
        async with SQLiteCheckpointStore(db) as store:
            await trim_finished(store, RetentionPolicy(None, trim_after_s=0.0), now=time.time() + 1, check=CHECK)

    runs_kit.in_thread(trim)
    # When order-2's page is read, Then it shows the run, its kept step, and why the rest is not there
    html = local.get("/runs/order-2").text
    assert "Rows of this run fail their check" not in html
    assert "Retention trimmed this finished run's checkpoints before step 4" in html
    assert "held it (how it began was trimmed by retention)" in html
    assert "tickets for Tosca sent" in html  # the state at the kept (latest) checkpoint
