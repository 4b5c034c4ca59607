"""When a write to Redis counts as stored: the ``wait_replicas`` / ``wait_fsync`` options and the server check.

Redis acknowledges a write once it is in the primary's memory. Replication is
asynchronous and the append-only file is fsynced once a second at best, so a failover
(a replica promoted) or a crash of the primary's host loses the last acknowledged
writes. For most of a run that is harmless: a lost checkpoint is replayed from the call
log, a lost idempotent call reruns. It is not harmless for the writes the run's
promise stands on, which `Durability.needs` names:

- a call record the journal marks ``durable`` (the ``started`` of a non-idempotent call:
  lost, the call would run again after a failover, although it may have had its effect);
- a checkpoint that opens a segment: a run's step 0 (the client was told the run
  started) and every claim (a recovery's fence, and every signed decision: an approval,
  a retry, what happened to a call in doubt).

Moving parts: `Durability` holds the options and appends ``WAIT numreplicas timeout``
(``wait_replicas``) or ``WAITAOF 1 numreplicas timeout`` (``wait_fsync``) to the same
pipeline as the write. Both wait for the writes made *on that connection*, which is
why the wait rides the write's pipeline (one connection, one round trip) rather than
following it. `check_server` reads the server once per client: ``WAITAOF`` needs Redis
7.2 (or Valkey), an append-only file and ``appendfsync always``. Under ``everysec`` the
server can answer ``WAITAOF`` early: a write made less than a second after the last fsync
is counted as fsynced although no fsync followed it (seen on Valkey 8.1.8 with the
fsync-recording shim of tests/_kit/disk.py; redis/redis#13793 is the same bug in Redis 7.4), so
the store refuses it rather than promise what the server does not keep. A server that
keeps nothing on disk is reported (a warning) or refused (``allow_volatile=False``, what the workers' settings
ask for unless ``AGENTFLOW_STORE_ALLOW_VOLATILE`` says it is a cache on purpose).

Invariant: a write that `needs` durability and was not acknowledged as configured
raises `StoreNotDurable` after it took effect on the primary. The caller treats it as a
store error: what depended on it does not happen yet (the tool does not run, the step
after the claim is not run), and the write itself may or may not survive, which the
protocol already copes with: a ``started`` with no end is a call in doubt, and a step 0 or
a claim that survives is a run like any other, recovered once the store answers (a start
retried with the same run id attaches to it: `RunProtocol.begin`). `RedisWrites.confirm`
waits the same way for what a run already holds, when a retried start attaches to it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from redis.asyncio import RedisCluster

from agentflow._errors import StoreNotDurable, StoreRefused

_log = logging.getLogger("agentflow.exec.checkpoints.redis")

#: The first Redis version with ``WAITAOF`` (Valkey reports a compatible ``redis_version``).
_WAITAOF_SINCE = (7, 2)
#: Servers already warned about (address), so a process warns once per server, not per client.
_warned: set[str] = set()


@dataclass(frozen=True)
class Durability:
    """What a write the run's promise stands on waits for before the store returns."""

    replicas: int = 0
    """``wait_replicas``: how many replicas must have the write (``WAIT``)."""
    fsync: bool = False
    """``wait_fsync``: the write must be in the append-only file on disk, here and on those replicas (``WAITAOF``)."""
    timeout_s: float = 1.0
    """``wait_timeout_s``: how long to wait for the acknowledgements."""
    allow_volatile: bool = True
    """Whether a server that keeps nothing on disk is only warned about (True) or refused."""

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 0:
            raise ValueError(f"wait_replicas must be a whole number of replicas, 0 or more; got {self.replicas!r}")
        if not isinstance(self.fsync, bool):
            raise ValueError(f"wait_fsync must be True or False; got {self.fsync!r}")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0.001 <= timeout <= 3600:
            raise ValueError(f"wait_timeout_s must be a number of seconds from 0.001 to 3600; got {timeout!r}")

    @property
    def waits(self) -> bool:
        """Whether any write waits at all."""
        return self.replicas > 0 or self.fsync

    def needs(self, *, durable_record: bool = False, step: int | None = None, segment: int | None = None) -> bool:
        """Whether this write waits: a record marked durable, or a checkpoint that opens a segment."""
        if not self.waits:
            return False
        return durable_record or (step is not None and step == segment)

    def add_wait(self, pipe: Any) -> None:
        """Queue the wait on `pipe`, after the write it covers (same connection)."""
        ms = max(1, round(self.timeout_s * 1000))
        if self.fsync:
            pipe.execute_command("WAITAOF", 1, self.replicas, ms)
        else:
            pipe.execute_command("WAIT", self.replicas, ms)

    def check_ack(self, reply: Any, run_id: str, what: str) -> None:
        """Raise `StoreNotDurable` unless `reply` (of the queued wait) acknowledges what was asked.

        `what` names the write (``the started record 0.3``, ``step 0``, ``step 7`` for a claim,
        or what `RedisWrites.confirm` confirmed); the message says what becomes of it.

        Raises:
            StoreNotDurable: too few replicas, or no local fsync, within ``wait_timeout_s``.
        """
        local, replicas = (int(reply[0]), int(reply[1])) if self.fsync else (1, int(reply))
        missing = []
        if local < 1:
            missing.append("the primary did not fsync it to its append-only file (wait_fsync)")
        if replicas < self.replicas:
            how = "fsynced it" if self.fsync else "acknowledged it"
            missing.append(f"only {replicas} of the {self.replicas} replicas asked for {how} (wait_replicas)")
        if missing:
            raise StoreNotDurable(
                f"run {run_id!r}: {what} is on the Redis primary, but {' and '.join(missing)} within "
                f"wait_timeout_s ({self.timeout_s} s), so a failover could lose it: {_then(what)}. Check the "
                "replicas' links and lag (or the disk), or raise wait_timeout_s"
            )


def _then(what: str) -> str:
    """What becomes of a run whose write `what` was not acknowledged (the truth, for its caller to act on)."""
    if what.startswith("the started record"):
        return "its tool did not run (should the record survive, the call is in doubt until someone says what happened)"
    if what == "step 0" or what.startswith("the run"):
        return (
            "the run may exist, and if it survives it goes on (recover_all or recover carries it on once the store "
            "answers); retry the start with the same run id, which attaches to the run rather than starting a second"
        )
    return "the run stopped there; if the claim survives, the run goes on from it, else from before it, once recovered"


async def check_server(client: Any, where: str, durability: Durability) -> None:
    """Read the server once for a new client; refuse what cannot work, warn about what keeps nothing.

    Raises:
        StoreRefused: a wait on Redis Cluster; ``wait_fsync`` on a server without
            ``WAITAOF``, an append-only file or ``appendfsync always``; or
            (``allow_volatile=False``) a server that keeps nothing on disk while the store
            waits for no replica.
    """
    if isinstance(client, RedisCluster):
        if durability.waits:
            raise StoreRefused(
                "RedisCheckpointStore: wait_replicas and wait_fsync are not supported on Redis Cluster (each shard's "
                "primary would have to be waited on apart); use one primary with replicas and Sentinel, or no waits"
            )
        return  # each node keeps its own settings: nothing to say of "the server"
    pipe = client.pipeline(transaction=False)
    pipe.info("server")
    pipe.info("persistence")
    pipe.execute_command("CONFIG", "GET", "save")
    pipe.execute_command("CONFIG", "GET", "appendfsync")
    server, persistence, save, appendfsync = await pipe.execute(raise_on_error=False)
    if isinstance(server, Exception) or isinstance(persistence, Exception):
        return  # a server that hides INFO (a managed one): nothing can be said, the waits still work
    version = _version(str(server.get("redis_version", "0")))
    aof = str(persistence.get("aof_enabled", "0")) == "1"
    if durability.fsync and version < _WAITAOF_SINCE:
        raise StoreRefused(
            f"RedisCheckpointStore(wait_fsync=True): Redis at {where} is version {server.get('redis_version')}, "
            "which has no WAITAOF (Redis 7.2 or Valkey 7.2 and later have it): upgrade the server, or use "
            "wait_replicas alone"
        )
    if durability.fsync and not aof:
        raise StoreRefused(
            f"RedisCheckpointStore(wait_fsync=True): Redis at {where} has no append-only file (appendonly no), "
            "so nothing can be fsynced: set 'appendonly yes' on the server (CONFIG SET appendonly yes, and in "
            "its configuration file), or drop wait_fsync"
        )
    if durability.fsync and _config(appendfsync) != "always":
        raise StoreRefused(
            f"RedisCheckpointStore(wait_fsync=True): Redis at {where} has appendfsync {_config(appendfsync)}, and "
            "WAITAOF cannot be trusted there: with 'no' it is never answered, and with 'everysec' a server can count "
            "a write as fsynced when the last fsync was under a second ago, before it is on disk (Valkey 8.1; "
            "redis/redis#13793). Set 'appendfsync always' on the primary and its replicas, or drop wait_fsync "
            "and wait for replicas instead (wait_replicas)"
        )
    saves = _saves(save)
    if aof or saves is None or saves or durability.replicas > 0:
        return
    why = (
        f'Redis at {where} keeps nothing on disk (appendonly no, save "") and the store waits for no '
        "replica: a restart of that server loses every run, and with it every call's started record"
    )
    if not durability.allow_volatile:
        raise StoreRefused(
            f"{why}. Turn persistence on (appendonly yes, appendfsync everysec or always), or set wait_replicas; "
            "if it is a cache on purpose, say so with AGENTFLOW_STORE_ALLOW_VOLATILE=1 (or allow_volatile=True)"
        )
    if where not in _warned:
        _warned.add(where)
        _log.warning("%s (see docs/stores/redis.md, Failover and durability)", why)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:2]:
        parts.append(int(part) if part.isdigit() else 0)
    return tuple(parts)


def _config(reply: Any) -> str | None:
    """The value a ``CONFIG GET`` of one parameter answered (None: the server would not say)."""
    if isinstance(reply, Exception):
        return None
    values = list(reply.values()) if isinstance(reply, dict) else list(reply)[1::2]
    if not values:
        return None
    value = values[0]
    return (value.decode() if isinstance(value, bytes) else str(value)).strip()


def _saves(reply: Any) -> bool | None:
    """Whether ``CONFIG GET save`` names snapshot points (None: the server would not say)."""
    value = _config(reply)
    return None if value is None else bool(value)
