"""The two race fixes, reverted on demand: what the simulation must catch when they are gone.

`claim_read_trusted` puts back the claim that trusts its read of the log (race 1: a late
``started`` between the read and the claim); `records_overwritable` puts back Redis
records that a rewound counter lets a write overwrite, and a head that trusts the counter
(race 2); `done_overruled` lets a later record overrule a call's own ``done``;
`parked_for_good` makes the sweep leave every parked run alone; `read_counted_by_segment` lets
a claim judge its read of the log by the earlier segments' counts alone (race 3: a late
``started`` hidden by a counter set back at once); `lease_unconfirmed` lets a tool run without its
worker confirming its lease (a worker stalled past its lease after ``started``); `signed_flags_ignored`
lets recovery ask only the registry deployed now whether a call in doubt may rerun (a tool
declared idempotent by a deploy since its call started reruns it); `paused_undecidable` makes
`decide_in_doubt` refuse a paused run again (a paused step's call in doubt then waits for ever).
Each patches the
code in this process only, for the ``with`` block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from unittest import mock

from agentflow._errors import CheckpointConflict
from agentflow.celery import _sweep
from agentflow.exec.calls import read as calls_read
from agentflow.exec.checkpoints.redis import _rows as _redis_rows
from agentflow.exec.checkpoints.redis import store as redis_store
from agentflow.exec.run import control as run_control
from agentflow.exec.run import protocol as run_protocol
from agentflow.exec.run import steps as run_steps
from agentflow.exec.run.checks import check_read_whole
from agentflow.exec.run.lease import Tenure
from agentflow.sim._world import World


@contextmanager
def claim_read_trusted() -> Iterator[None]:
    """Race 1's fix reverted: a claim no longer counts the log again after it fenced the old segment."""

    async def trusting(self: Any, cur: Any, counts: Any, claim_step: int, opened: int = 0) -> None:
        return None

    with mock.patch.object(run_steps.RunSteps, "_read_still_whole", trusting):
        yield


@contextmanager
def records_overwritable() -> Iterator[None]:
    """Race 2's fix reverted: Redis writes at a taken position, and the head trusts the counter."""
    lua = dict(redis_store._LUA)
    for name in ("record_call", "save"):
        lines = lua[name].splitlines()
        lua[name] = "\n".join(line.replace("taken or ", "") for line in lines)
        assert lua[name] != redis_store._LUA[name], f"{name}.lua no longer has the append-only check this reverts"
    original = _redis_rows._head_of  # redis/store.py calls it by the name it imported: that name is patched

    def trusting_head(run_id: str, raw: bytes, fields: Any, stored: int) -> Any:
        return original(run_id, raw, fields, 0)  # no surplus: the counter is believed

    with mock.patch.dict(redis_store._LUA, lua), mock.patch.object(redis_store, "_head_of", trusting_head):
        yield


@contextmanager
def done_overruled() -> Iterator[None]:
    """The late-done fix reverted: a record after a call's ``done`` (an operator's "did not happen") wins."""
    with mock.patch.object(calls_read, "settled", lambda state: False):
        yield


@contextmanager
def parked_for_good() -> Iterator[None]:
    """The parked-run fix reverted: the sweep leaves a parked run alone even when nothing is in doubt any more."""

    async def always(self: Any, run_id: str) -> bool:
        return True

    with mock.patch.object(_sweep._Sorter, "_still_in_doubt", always):
        yield


@contextmanager
def read_counted_by_segment() -> Iterator[None]:
    """Race 3's fix reverted: a claim checks the earlier segments' counts only, not the log's total."""

    def by_segment(run_id: str, claim_step: int, read: Any, now: Any, opened: int = 0) -> None:
        check_read_whole(run_id, claim_step, read, now, sum(now.values()) - sum(read.values()))

    with mock.patch.object(run_steps, "check_read_whole", by_segment):
        yield


@contextmanager
def lease_unconfirmed() -> Iterator[None]:
    """The stalled-worker fix reverted: a tool runs without its worker confirming its lease first."""

    async def sure(self: Any, unclaimed: Any) -> bool:
        return True

    with mock.patch.object(Tenure, "confirm", sure):
        yield


@contextmanager
def signed_flags_ignored() -> Iterator[None]:
    """The signed-record fix reverted: a call in doubt reruns unasked whenever its tool is idempotent now."""

    def deployed_only(state: Any, registry: Any) -> str | None:
        return None if state.tool in registry and registry.get(state.tool).idempotent else ""

    with (
        mock.patch.object(calls_read, "needs_decision", deployed_only),
        mock.patch.object(run_control, "needs_decision", deployed_only),
    ):
        yield


Revert = Callable[[], AbstractContextManager[None]]


def with_lease_unconfirmed(revert: Revert) -> Revert:
    """`revert`, and `lease_unconfirmed` too: for a race whose double effect the lease check also stops.

    A worker stalled past its lease after a late ``started`` now withholds its tool, which
    closes the double effect of races 1 and 3 and of the late ``done`` a second way. The
    simulation finds each of them with both fixes out, and each entry's plain test proves its
    own fix alone. The invariant that a tool starts only on a worker holding its run is off
    too: without the lease check it breaks first, in nearly every episode with a stall.
    """

    async def unchecked(self: Any, tool: str) -> None:
        return None

    @contextmanager
    def both() -> Iterator[None]:
        with revert(), lease_unconfirmed(), mock.patch.object(World, "starts", unchecked):
            yield

    return both


@contextmanager
def paused_undecidable() -> Iterator[None]:
    """The paused run's decision reverted: `decide_in_doubt` refuses a paused run, as it did before.

    A round paused on an approval while a call of it that a decision let rerun had not run
    again (its tool was renamed by a deploy) then waits for ever: its resume needs a decision
    on that call, and no decision is taken.
    """
    original = run_protocol.RunProtocol.decide_in_doubt

    async def refusing(self: Any, run_id: str, **kwargs: Any) -> int:
        if self.store is not None and (await self.store.latest(run_id)).status == "paused":
            raise CheckpointConflict(f"run {run_id!r} is paused: it has no call in doubt to decide")
        return await original(self, run_id, **kwargs)

    with mock.patch.object(run_protocol.RunProtocol, "decide_in_doubt", refusing):
        yield
