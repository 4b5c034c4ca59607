"""A real worker logging at DEBUG: neither the checkpoint key nor the Redis password shows in its log."""

from __future__ import annotations

import pytest
from _kit.secrets import leaks, redis_user
from celery_kit import Deployment, ended

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.timeout(120)]


async def test_a_worker_at_debug_logs_neither_the_key_nor_the_redis_password(tmp_path, redis_url):
    with redis_user(redis_url) as (url, password):
        deployment = Deployment(tmp_path, url)
        try:
            # Given a worker at DEBUG whose Redis URL (broker, results, store) carries a password
            deployment.log_level = "DEBUG"
            deployment.start_worker("w1", concurrency=1)
            # When it runs a ticket run, and is sent a rerun message no decision backs
            run_id = await deployment.client.start("tickets", {"show": "logs"})
            assert (await deployment.client.settle(run_id, timeout_s=30)).status == "done"
            refused = deployment.tasks.superstep.apply_async(
                args=("tickets", run_id, 3, "rerun"), queue=deployment.values["queue"]
            )
            assert (await ended(refused))["done"] == "refused"
        finally:
            deployment.close()
    # Then its log has the run in it, and no form of the key or the password
    log = deployment.log("w1")
    assert f"refused to act on run {run_id}" in log and "DEBUG" in log
    key = bytes.fromhex(deployment.values["checkpoint_keys"].removeprefix("hex:"))
    raw = (tmp_path / "w1.log").read_bytes()
    assert leaks(log, [("key", key), ("password", password)]) == []
    assert key not in raw and password.encode() not in raw
