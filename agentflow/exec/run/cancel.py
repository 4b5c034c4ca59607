"""Cancelling a run a live worker holds: a signed request that the holder honours.

A run nobody holds is cancelled at once (`RunProtocol.cancel` saves the ``cancel`` claim
itself). A run a live worker holds cannot be: only the holder may write its rows. So the
canceller leaves a request, and the holder ends the run.

Moving parts:
- `post`: the canceller's side. The request (run, reason, operator, when) is left as the
  signed marker ``cancel/<run>`` (`agentflow.exec.run.markers`): every process shares the
  store's markers, a put is atomic, and the marker lapses on its own after `REQUEST_TTL_S`
  (a run that ended meanwhile never reads it).
- `CancelWatch`: the holder's side. It reads the marker at every step boundary (before a
  drive's first step and after each step, before its save) and before a call starts
  (calls that start together, with no call ending in between, share one read) and raises
  `CancelRequested` once a signed request is there. A worker's first look is the marker
  as the lease's take read it, where the store reads both in one round trip (Redis:
  `run.lease.holding_reading_head`); it is checked as any read is. One read is left out: after the last
  step a drive runs (a worker's drive runs one), when the previous read is younger than
  `FRESH_S`. No call starts between that step's end and the next drive's first read, so a
  request that came in those milliseconds is met there, as one made a moment later would
  be: the step is saved, and the next drive ends the run before it starts a call (or the
  run had ended, and the request lapses). A quick worker superstep so reads once, not twice.
- `RunProtocol` catches `CancelRequested` around every drive: the calls already in flight
  have finished and are logged by then (a superstep lets its other nodes finish; a tool
  loop runs its calls one by one), and the run ends ``cancelled`` with the same signed
  claim as a direct cancel, naming the request's operator and reason. Then the marker goes.

Invariants:
- Only a request whose signature checks stops a run. Any other marker there (written by
  hand, changed, signed with a key the holder lacks) is reported (a WARNING and
  ``control.refused``) and removed (`run.markers`), so it neither stops the run nor keeps a
  real request out.
- A call that started before the holder saw the request is not interrupted: it finishes
  and its ``done`` (or ``failed``) record is logged before the run ends.
- A request made before the run started (for an earlier run of the same id, pruned since)
  is removed, never obeyed: each checkpoint carries the run's signed start.
- The request is a wish; the ``cancel`` claim is the fact. Nothing but a holder of the run's
  lease saves that claim, so a request can neither fork a run nor end one twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Final

from agentflow._errors import CheckpointStoreCorrupt
from agentflow._events import Events
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.records import Marker
from agentflow.exec.run.lease import UNREAD
from agentflow.exec.run.markers import Markers, Note, key_of
from agentflow.exec.seal import Sealer

log = logging.getLogger("agentflow.cancel")

#: The marker's kind (``cancel/<run>``).
KIND: Final = "cancel"
#: How long a request waits for its run's holder (then its marker lapses).
REQUEST_TTL_S: Final = 24 * 3600.0
#: The longest each kind of marker here lasts (`Markers`' ``longest``).
LONGEST: Final = {KIND: REQUEST_TTL_S}
#: How young (seconds) a read may be to stand for the one after a drive's last step (`CancelWatch.step_ended`).
FRESH_S: Final = 0.05


@dataclass(frozen=True)
class CancelRequest:
    """An operator's signed wish that a run stop."""

    run_id: str
    reason: str
    operator: str | None
    """Who asked (signed into the ``cancel`` claim that ends the run)."""
    at: float
    """When the request was made (seconds since the epoch)."""

    def body(self) -> dict[str, Any]:
        """What is signed."""
        return {"run_id": self.run_id, "reason": self.reason, "operator": self.operator, "at": self.at}


class CancelRequested(Exception):
    """Raised where a run's holder stands when it finds a signed cancel request (internal)."""

    def __init__(self, request: CancelRequest) -> None:
        super().__init__(f"run {request.run_id!r}: cancel requested by {request.operator or 'an operator'}")
        self.request = request


def read_request(note: Note, run_id: str) -> CancelRequest:
    """The request a cancel marker that counts carries.

    Raises:
        CheckpointStoreCorrupt: the marker is signed but carries no request for this run.
    """
    body = note.body
    try:
        request = CancelRequest(run_id, str(body["reason"]), body["operator"], float(body["at"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointStoreCorrupt(
            f"the cancel request for run {run_id!r} is signed but malformed: {exc!r}"
        ) from None
    if body.get("run_id") != run_id or (request.operator is not None and not isinstance(request.operator, str)):
        raise CheckpointStoreCorrupt(f"the cancel request for run {run_id!r} is signed but malformed")
    return request


async def post(store: CheckpointStore, sealer: Sealer, request: CancelRequest) -> CancelRequest:
    """Leave a signed request for the run's holder; return the request that stands.

    An earlier request that counts stands (the first reason is the one signed into the
    run); a marker that does not count is replaced (`Markers.put`).

    Raises:
        CheckpointStoreCorrupt: markers that do not count keep appearing (someone writes
            them as fast as they are removed).
    """
    mine, note = await Markers(store, sealer, longest=LONGEST).put(KIND, request.run_id, request.body(), REQUEST_TTL_S)
    return request if mine else read_request(note, request.run_id)


async def withdraw(store: CheckpointStore, sealer: Sealer, run_id: str) -> None:
    """Remove the run's cancel request, if any (the run ended, so it is spent or moot)."""
    await Markers(store, sealer, longest=LONGEST).take_all(KIND, [run_id])


class CancelWatch:
    """A holder's look-out for a cancel request on one run (see the module docstring)."""

    def __init__(
        self,
        store: CheckpointStore,
        sealer: Sealer,
        run_id: str,
        events: Events,
        started_at: float | None = None,
        *,
        steps: int | None = None,
        seen: Marker | None | object = UNREAD,
    ) -> None:
        """`steps`: how many steps the drive runs at most (None: until the run ends or pauses).

        `seen`: the run's cancel marker as the lease's take read it a moment ago (None: there
        was none; `UNREAD`: the take did not read it): the first look takes it instead of
        reading the store. Nothing starts between that take and the first look, so it stands
        for a read made then, as a read left out after a quick last step does.
        """
        self._markers = Markers(store, sealer, events, LONGEST)
        self.run_id = run_id
        self._started_at = started_at
        self._fresh = False
        self._steps_left = steps
        self._read_at: float | None = None  # time.monotonic() of the last read
        self._seen = seen
        self.found: CancelRequest | None = None
        """The request seen, once one was (it stays: the holder starts nothing after it)."""

    def moved(self) -> None:
        """Note that a call ended: the next check reads the store again."""
        self._fresh = False

    async def step_ended(self) -> None:
        """The boundary after a step, before its save: `check`, unless the read may be left out.

        Left out after the drive's last step when the last read is younger than `FRESH_S`
        (see the module docstring).

        Raises:
            CancelRequested: the run is to stop; nothing of the step is kept.
        """
        if self._steps_left is not None:
            self._steps_left -= 1
            fresh = self._read_at is not None and time.monotonic() - self._read_at < FRESH_S
            if self._steps_left <= 0 and self.found is None and fresh:
                return
        await self.check(boundary=True)

    async def check(self, *, boundary: bool = False) -> None:
        """Raise `CancelRequested` if a signed request is there.

        A step boundary always reads the store; a call reads it unless nothing ended
        since the last read (concurrent calls starting together share it).

        Raises:
            CancelRequested: the run is to stop; no call may start after this.
        """
        if self.found is None:
            if self._fresh and not boundary:
                return
            self._fresh = True
            self._read_at = time.monotonic()
            note = (await self._look()).get(self.run_id)
            if note is None:
                return
            try:
                found = read_request(note, self.run_id)
            except CheckpointStoreCorrupt as exc:
                log.warning("run %s: removing a cancel request: %s", self.run_id, exc, extra={"run_id": self.run_id})
                await self._markers.take(note)
                return
            if self._started_at is not None and found.at < self._started_at:
                # Made for an earlier run of this id (pruned since): it is not this run's to obey.
                log.info(
                    "run %s: removing a cancel request older than the run", self.run_id, extra={"run_id": self.run_id}
                )
                await self._markers.take(note)
                return
            self.found = found
        raise CancelRequested(self.found)

    async def _look(self) -> dict[str, Note]:
        """The run's cancel marker if it counts: the one the take read, the first time, else the store's."""
        seen, self._seen = self._seen, UNREAD
        if isinstance(seen, Marker):
            return await self._markers.opened(KIND, {key_of(KIND, self.run_id): self.run_id}, {seen.key: seen})
        if seen is None:
            return {}
        return await self._markers.peek(KIND, [self.run_id])
