"""kombu's Sentinel transport, with a worker that survives losing its broker while it holds a message.

When the connection to the primary drops, Celery closes the channel, and closing it puts
the unacknowledged messages back (``restore_unacked``), which makes a new pool from the
connection's parameters. By then kombu 5.7 has released the connection (``client`` is
None) and the Sentinel channel fails with ``AttributeError``, which Celery takes for an
unrecoverable error: the worker process exits (seen in the failover tests: a worker with a
superstep in hand when Sentinel's primary was SIGKILLed). Here the same situation raises a
connection error, which the close ignores as it does any other, and the consumer reconnects
to the new primary. The messages it held stay in the broker's unacknowledged set, put back
by the next restore (``unacked_restore_interval``) or after the visibility timeout; the
runs they were for are recovered by their leases and ``recover_all`` meanwhile, as after
any lost message.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from redis import exceptions as redis_errors


class SentinelChannel(kombu_redis.SentinelChannel):
    """A Sentinel channel that says "no connection" instead of failing when its connection is gone."""

    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            raise redis_errors.ConnectionError("the broker connection is closed; the consumer reconnects")
        return super()._connparams(asynchronous)  # type: ignore[no-untyped-call]


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with `SentinelChannel` (``broker_transport`` of a ``redis+sentinel://`` broker)."""

    Channel = SentinelChannel
