"""The broker and the store named apart, without servers: the Celery configuration, the settings, the store opened.

`celery_config` on a Redis broker is what it always was; on RabbitMQ it declares every queue
a quorum queue behind a topic exchange and keeps results off the broker. `Settings` default
both URLs to ``AGENTFLOW_REDIS_URL``; the workers open the store the URL names, with the
deployment's prefix where the URL gives none.
"""

from __future__ import annotations

import secrets

import pytest
from pydantic import ValidationError

from agentflow.celery import celery_config
from agentflow.exec.checkpoints import RedisCheckpointStore, SQLAlchemyCheckpointStore
from config import Settings
from workers.build import store_factory, store_url

KEYS = "hex:" + secrets.token_hex(32)
RABBIT = "amqp://agentflow:pw-rabbit@rabbit:5672/agentflow"
POSTGRES = "postgresql+asyncpg://agentflow:pw-postgres@db/agentflow"


def settings(**values: object) -> Settings:
    return Settings(**{"app": "celery_flows:app", "checkpoint_keys": KEYS, **values})  # type: ignore[arg-type]


def test_a_redis_broker_gets_the_configuration_it_always_had():
    conf = celery_config("redis://r:6379/0", key_prefix="p", queue="q", visibility_timeout_s=100)
    assert conf["broker_url"] == conf["result_backend"] == "redis://r:6379/0"
    assert conf["broker_transport_options"]["visibility_timeout"] == 100
    assert conf["broker_transport_options"]["global_keyprefix"] == "p:celery:"
    assert conf["worker_cancel_long_running_tasks_on_connection_loss"] is True
    assert not any("quorum" in str(value) for value in conf.values())


def test_a_rabbitmq_broker_declares_quorum_queues_and_keeps_results_off_it():
    conf = celery_config(RABBIT, queue="q")
    assert conf["task_default_queue_type"] == conf["task_create_missing_queue_type"] == "quorum"
    assert conf["task_default_exchange_type"] == conf["task_create_missing_queue_exchange_type"] == "topic"
    assert conf["broker_native_delayed_delivery_queue_type"] == "quorum"
    assert conf["broker_transport_options"] == {"confirm_publish": True}  # no visibility timeout
    assert conf["result_backend"] is None
    assert conf["worker_cancel_long_running_tasks_on_connection_loss"] is False
    assert conf["task_acks_late"] is True and conf["worker_prefetch_multiplier"] == 1
    with_results = celery_config(RABBIT, key_prefix="p", result_backend="redis://r:6379/1")
    assert with_results["result_backend_transport_options"] == {"global_keyprefix": "p:celery:"}


def test_one_redis_stays_the_default_for_broker_and_store():
    made = settings(redis_url="redis://r:6379/2")
    assert made.broker() == made.store() == made.result_backend() == "redis://r:6379/2"


def test_named_apart_each_url_is_used_and_results_go_to_a_redis_only_if_one_was_given():
    made = settings(broker_url=RABBIT, store_url=POSTGRES)
    assert (made.broker(), made.store(), made.result_backend()) == (RABBIT, POSTGRES, None)
    assert "pw-" not in repr(made) and "pw-" not in str(made)
    assert settings(broker_url=RABBIT, redis_url="redis://r:6379/3").result_backend() == "redis://r:6379/3"


def test_an_empty_url_is_unset_and_the_visibility_timeout_matters_only_on_redis():
    made = settings(broker_url="", store_url=" ")
    assert made.broker_url is None and made.store_url is None
    settings(broker_url=RABBIT, visibility_timeout_s=10)  # RabbitMQ has no visibility timeout
    with pytest.raises(ValidationError, match="VISIBILITY_TIMEOUT"):
        settings(visibility_timeout_s=10)


def test_urls_of_another_kind_are_refused_in_one_message_that_shows_no_password():
    with pytest.raises(ValidationError) as caught:
        settings(broker_url="sqs://key:pw-secret@", store_url="mysql://u:pw-secret@db/x")
    text = str(caught.value)
    assert "AGENTFLOW_BROKER_URL" in text and "AGENTFLOW_STORE_URL" in text and "pw-secret" not in text


def test_the_store_gets_the_deployments_prefix_and_durability_unless_its_url_names_them():
    durability = "allow_volatile=0&wait_replicas=0&wait_fsync=0&wait_timeout_s=1.0"
    expected = f"redis://127.0.0.1:6379/0?prefix=acme&ttl_s=60&{durability}"
    assert store_url(settings(key_prefix="acme", ttl_s=60)) == expected
    assert (
        store_url(settings(key_prefix="acme", store_url=POSTGRES)) == f"{POSTGRES}?table_prefix=acme_&allow_volatile=0"
    )
    given = f"{POSTGRES}?ssl=require&table_prefix=other_&allow_volatile=1"
    assert store_url(settings(key_prefix="acme", store_url=given)) == given


def test_the_durability_settings_reach_every_workers_store():
    # Given AGENTFLOW_STORE_WAIT_REPLICAS=1, _WAIT_FSYNC=1, _WAIT_TIMEOUT_S=0.5 and a Sentinel URL
    made = settings(
        store_url="redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/primary-a/2",
        store_wait_replicas=1,
        store_wait_fsync=True,
        store_wait_timeout_s=0.5,
        store_allow_volatile=True,
    )
    # Then each worker process's store waits as asked
    store = store_factory(made)()
    assert isinstance(store, RedisCheckpointStore)
    assert (store.durability.replicas, store.durability.fsync, store.durability.timeout_s) == (1, True, 0.5)
    assert store.durability.allow_volatile


def test_a_sentinel_broker_becomes_kombus_sentinel_urls_with_the_primarys_name():
    made = settings(broker_url="redis+sentinel://:pw-secret@10.0.0.1:26379,10.0.0.2/primary-a/1")
    config = made.celery()
    assert config["broker_url"] == "sentinel://:pw-secret@10.0.0.1:26379/1;sentinel://:pw-secret@10.0.0.2:26379/1"
    assert config["broker_transport_options"]["master_name"] == "primary-a"
    assert config["result_backend"].startswith("sentinel://")
    assert config["result_backend_transport_options"]["master_name"] == "primary-a"
    assert "pw-secret" not in repr(made)


def test_a_sentinel_url_without_its_primarys_name_is_refused_saying_how_to_write_it():
    with pytest.raises(SystemExit, match=r"redis\+sentinel://host:26379,host2:26379/<primary name>"):
        store_factory(settings(store_url="redis+sentinel://127.0.0.1:26379"))


async def test_each_worker_process_opens_the_store_the_url_names():
    sql = store_factory(settings(store_url=POSTGRES))()
    redis = store_factory(settings())()
    try:
        assert isinstance(sql, SQLAlchemyCheckpointStore) and "agentflow_" in repr(sql)
        assert isinstance(redis, RedisCheckpointStore)
    finally:
        await sql.aclose()
        await redis.aclose()
    with pytest.raises(SystemExit, match="AGENTFLOW_STORE_URL"):
        store_factory(settings(store_url="postgresql+asyncpg://db/x", key_prefix="Not.A.Table"))
