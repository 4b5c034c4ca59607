"""The run leases of `RedisCheckpointStore`: one hash per held run, with an expiry of its own.

Key layout (``P`` is the store's prefix, ``R`` the run id)::

    P:run:{R}:lease     hash   owner, token, expires_at (ms since the epoch, on the server's clock)

The key carries the run's hash tag, so on Redis Cluster it lives in the slot of the run's
other keys; it is not one of the keys the save and record scripts take, and `delete`
removes it with them. Take, renew and release are ``_lua/lease.lua``: one script reads
the server's TIME, judges the lease and writes it, so of racing takers exactly one gets a
free or lapsed lease, and hosts with skewed clocks agree. A take may also read the run's
head in the same script (`take_reading`: the lease and the head in one round trip). The script sets the key to
expire the millisecond before the lease lapses, so Redis drops it by itself and a plain
read sees only live leases: `read` is one pipelined HMGET per run, in chunks, each chunk
under the store's deadline (a Cluster client sends each key to its slot's node); a read of
one run's lease, as a holder makes at every step, is a plain HMGET (redis-py's pipeline
costs about 100 µs more per round trip than a command).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Final

from agentflow._errors import CheckpointStoreCorrupt
from agentflow.exec.checkpoints.records import Lease
from agentflow.exec.checkpoints.redis._rows import _text
from agentflow.exec.checkpoints.redis.clients import MAX_PIPELINE, LoopClients
from agentflow.exec.checkpoints.rules import check_lease_args

#: The longest lease the store writes (about 31 years); a longer `ttl_s` is cut to it.
_MAX_TTL_S: Final = 1e9
#: How many leases one pipelined read asks for.
_CHUNK: Final = MAX_PIPELINE


def _ms(ttl_s: float) -> int:
    """The lifetime in whole milliseconds, rounded up (a positive ttl is at least 1 ms)."""
    return math.ceil(min(ttl_s, _MAX_TTL_S) * 1000)


class Leases:
    """The leases under one prefix; `lease_key` names a run's lease key (and checks the run id)."""

    def __init__(self, clients: LoopClients, lease_key: Callable[[str], str]) -> None:
        self._clients = clients
        self._key = lease_key

    async def _script(self, run_id: str, args: list[str | int]) -> list[str]:
        key = self._key(run_id)
        async with self._clients.use() as bound:
            return [_text(part) for part in await bound.scripts["lease"](keys=[key], args=args)]

    def _lease(self, run_id: str, owner: Any, token: Any, expires_at: Any) -> Lease:
        try:
            if owner is None or token is None or expires_at is None:
                raise ValueError("a field is missing")
            return Lease(run_id, _text(owner), _text(token), int(_text(expires_at)) / 1000)
        except ValueError:
            raise CheckpointStoreCorrupt(
                f"run {run_id!r}: its lease hash is not one this store wrote ({owner!r}, {token!r}, {expires_at!r})"
            ) from None

    async def take(self, run_id: str, owner: str, token: str, ttl_s: float) -> Lease:
        """Take the lease unless another live token holds it; return the lease as it stands."""
        return (await self.take_reading(run_id, owner, token, ttl_s, ()))[0]

    async def take_reading(
        self, run_id: str, owner: str, token: str, ttl_s: float, head_keys: Sequence[str]
    ) -> tuple[Lease, Any, int, list[Any], list[Any]]:
        """`take`, and when it wrote the lease, the run's head (and a marker about it) in the same script.

        `head_keys`: the run's checkpoint list, per-segment counts hash and calls hash, and
        optionally a marker's key in the run's slot (none: a plain take, as `take` makes).
        Returns the lease as it stands, the newest checkpoint row as stored (None: no row, no
        head asked, or the lease was not taken), how many records the calls hash holds, the
        counts hash flattened (field, value, ...), and the marker's hash fields (value, token,
        expires_at; each None when there is none).
        """
        check_lease_args(owner, token, ttl_s)
        key = self._key(run_id)
        async with self._clients.use() as bound:
            reply = await bound.scripts["lease"](keys=[key, *head_keys], args=["take", token, _ms(ttl_s), owner])
        lease = self._lease(run_id, *reply[1:4])
        if len(reply) < 6:  # no head asked, or another holder's live lease: none was read
            return lease, None, 0, [], [None, None, None]
        return lease, reply[4] or None, int(reply[5]), list(reply[9:]), list(reply[6:9])

    def held(self, key: str, fields: Sequence[Any]) -> Lease | None:
        """The lease (or marker) under `key` from its hash fields as read (None: none live there)."""
        return self._lease(key, *fields) if any(value is not None for value in fields) else None

    async def renew(self, run_id: str, token: str, ttl_s: float) -> Lease | None:
        """Push the lease's expiry if `token` holds it live; None if it does not."""
        reply = await self._script(run_id, ["renew", token, _ms(ttl_s)])
        return self._lease(run_id, *reply[1:]) if reply[0] == "held" else None

    async def release(self, run_id: str, token: str) -> bool:
        """Delete `token`'s lease of the run; return whether it was live."""
        return (await self._script(run_id, ["release", token]))[0] == "released"

    async def read(self, run_ids: Sequence[str]) -> dict[str, Lease]:
        """The live leases among `run_ids` (a key that is there is live: it expires when the lease lapses)."""
        unique = list(dict.fromkeys(run_ids))
        keys = [self._key(run_id) for run_id in unique]
        found: dict[str, Lease] = {}
        if len(keys) == 1:  # a run's own check (its cancel marker, each step): one command, no pipeline
            async with self._clients.use() as bound:
                fields = await bound.client.hmget(keys[0], ["owner", "token", "expires_at"])
            found_one = self.held(unique[0], fields)
            return {} if found_one is None else {unique[0]: found_one}
        for start in range(0, len(unique), _CHUNK):
            async with self._clients.use() as bound:
                pipe = bound.client.pipeline(transaction=False)
                for key in keys[start : start + _CHUNK]:
                    pipe.hmget(key, ["owner", "token", "expires_at"])
                replies: list[list[Any]] = await pipe.execute()
            for run_id, fields in zip(unique[start : start + _CHUNK], replies, strict=True):
                lease = self.held(run_id, fields)
                if lease is not None:
                    found[run_id] = lease
        return found
