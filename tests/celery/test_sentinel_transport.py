"""The Sentinel broker's channel, when its connection is gone, says so with a connection error (not a crash).

kombu 5.7's Sentinel channel reads the released connection's parameters while it puts the
unacknowledged messages back, and fails with ``AttributeError``: Celery takes that for an
unrecoverable error and the worker exits (seen once under load in the failover tests, with
a superstep in hand when the primary was SIGKILLed). `agentflow.celery._sentinel` raises a
connection error there, which the channel's close ignores, so the consumer reconnects; the
failover test (`test_failover.py`) runs the whole path against real Sentinels.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kombu.transport import redis as kombu_redis
from redis import exceptions as redis_errors

from agentflow.celery import celery_config
from agentflow.celery._sentinel import SentinelChannel, SentinelTransport


def _released(cls: Any) -> Any:
    channel = cls.__new__(cls)
    channel.connection = SimpleNamespace(client=None)  # what a released connection leaves
    return channel


def test_kombus_own_sentinel_channel_fails_with_an_attribute_error_there() -> None:
    with pytest.raises(AttributeError, match="hostname"):
        _released(kombu_redis.SentinelChannel)._connparams()


def test_ours_raises_a_connection_error_the_close_ignores() -> None:
    with pytest.raises(redis_errors.ConnectionError, match="reconnects"):
        _released(SentinelChannel)._connparams()
    assert issubclass(redis_errors.ConnectionError, SentinelTransport.connection_errors)


def test_a_sentinel_broker_uses_it_and_a_plain_redis_broker_does_not() -> None:
    sentinel = celery_config("redis+sentinel://127.0.0.1:26379/primary/0")
    assert sentinel["broker_transport"] == "agentflow.celery._sentinel:SentinelTransport"
    assert "broker_transport" not in celery_config("redis://127.0.0.1:6379/0")
