"""The store's Lua scripts as one Redis Functions library, loaded by an admin and called with FCALL.

Why: a worker that runs the scripts with EVALSHA must also be allowed EVAL (the script cache
is not persisted or replicated, so the store loads the scripts again after a restart or a
failover), and a user allowed EVAL can run a script of its own. A Functions library is
persisted and replicated with the data: an admin loads it once per deploy (`load_library`,
``FUNCTION LOAD REPLACE``), and the workers need only ``FCALL``, never EVAL, SCRIPT or
FUNCTION (docs/security.md gives the ACL, tested in tests/checkpoints/test_redis_acl.py).

What it does not change: Redis checks every command a function runs against the calling
user's ACL (commands and keys), exactly as for EVAL. A function gives a user no right it
does not hold, so a worker still holds, raw, every command the store's writes run (HSET on
the call log and its counters, RPUSH on the rows...). The ACL narrows those to the keys
they are needed on; docs/security.md says what stays open.

- `library(scripts)`: the library's text, one function per script. Its name carries a digest
  of the scripts (``agentflow_<digest>``), and so do the functions' (``agentflow_<digest>_<script>``):
  a worker of one release never calls another release's functions, and both releases'
  libraries can be loaded at once during a rolling deploy.
- `load_library(client, scripts)`: the deploy step (``FUNCTION LOAD REPLACE``, on every primary
  of a Cluster), as an admin.
- `FunctionCall`: what a `LoopClients` registers in place of redis-py's `AsyncScript` when the
  store is made with ``functions=True``; called the same way (``keys=``, ``args=``, ``client=``).
- `not_loaded(error)`: the `CheckpointError` for a server that lacks this release's library.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from redis import exceptions as redis_errors

from agentflow._errors import CheckpointError


def library_name(scripts: Mapping[str, str]) -> str:
    """The library's name: ``agentflow_`` and a digest of the scripts' names and texts."""
    digest = hashlib.sha256()
    for name in sorted(scripts):
        digest.update(f"{name}\0{scripts[name]}\0".encode())
    return f"agentflow_{digest.hexdigest()[:16]}"


def function_name(library: str, script: str) -> str:
    """The name script `script` is registered under in `library`."""
    return f"{library}_{script}"


def library(scripts: Mapping[str, str]) -> str:
    """The text of the library: each script's body, unchanged, as the callback of one function.

    A script reads ``KEYS`` and ``ARGV`` as globals; here they are the callback's parameters,
    and the script's top-level locals (its helpers included) are the callback's.
    """
    name = library_name(scripts)
    parts = [f"#!lua name={name}"]
    for script, text in sorted(scripts.items()):
        parts.append(f"redis.register_function('{function_name(name, script)}', function(KEYS, ARGV)\n{text}\nend)")
    return "\n".join(parts) + "\n"


def not_loaded(error: BaseException, library_name: str) -> CheckpointError | None:
    """The error to raise for `error` when it says the server lacks the library; None for any other error."""
    if isinstance(error, redis_errors.ResponseError) and "function not found" in str(error).lower():
        return CheckpointError(
            f"RedisCheckpointStore(functions=True): the server has no function library {library_name} (this "
            "release's scripts). Load it once per deploy, as a user allowed FUNCTION LOAD: "
            "await RedisCheckpointStore.load_functions(<admin client>) (docs/security.md)"
        )
    return None


async def load_library(client: Any, scripts: Mapping[str, str]) -> str:
    """Load (or replace) the library of `scripts` on `client`'s server, every primary of a Cluster; return its name.

    `client` is an admin's (a user allowed ``FUNCTION LOAD``): a deploy step, run once per
    release, never by a worker. Loading the same library again changes nothing.
    """
    if hasattr(client, "get_primaries"):  # a Cluster: each primary keeps its own functions
        await client.initialize()
        for node in client.get_primaries():
            await client.execute_command("FUNCTION", "LOAD", "REPLACE", library(scripts), target_nodes=node)
    else:
        await client.execute_command("FUNCTION", "LOAD", "REPLACE", library(scripts))
    return library_name(scripts)


class FunctionCall:
    """One script called as a function of the loaded library (``FCALL``); see the module notes."""

    def __init__(self, client: Any, library_name: str, script: str) -> None:
        self.client = client
        self.library = library_name
        self.name = function_name(library_name, script)

    def command(self, keys: list[Any], args: list[Any]) -> tuple[Any, ...]:
        """The ``FCALL`` command's words, for a pipeline that carries it beside another command."""
        return ("FCALL", self.name, len(keys), *keys, *args)

    async def __call__(self, keys: list[Any] | None = None, args: list[Any] | None = None, client: Any = None) -> Any:
        """Run the function; with `client` a pipeline, queue it there (the reply comes with the pipeline's)."""
        keys, args = list(keys or ()), list(args or ())
        target = self.client if client is None else client
        try:
            return await target.fcall(self.name, len(keys), *keys, *args)
        except redis_errors.ResponseError as exc:
            missing = not_loaded(exc, self.library)
            if missing is not None:
                raise missing from None
            raise


def main(argv: list[str] | None = None) -> int:
    """``python -m agentflow.exec.checkpoints.redis.functions URL``: load this release's library, as an admin.

    The URL is an admin's (``redis://agentflow-admin:<password>@host:6379/0``, or any form
    `RedisCheckpointStore.from_url` takes); it is never printed. Prints the library's name.
    """
    import asyncio
    import sys

    from agentflow.exec.checkpoints.redis.store import RedisCheckpointStore
    from agentflow.exec.checkpoints.redis.urls import client_factory

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m agentflow.exec.checkpoints.redis.functions REDIS_URL (an admin's)", file=sys.stderr)
        return 2

    async def load() -> str:
        client = client_factory(args[0], 10.0)()
        try:
            return await RedisCheckpointStore.load_functions(client)
        finally:
            await client.aclose()

    print(asyncio.run(load()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
