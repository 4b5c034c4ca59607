"""The port every checkpoint store implements.

Rules every backend keeps (the conformance suite in `conformance.py` checks each one):

- `save` is a compare-and-set: step 0 only for a run the store does not have; any other
  step exactly one past the stored latest. A run whose latest checkpoint ended (``done``
  or ``failed``) takes no more saves, and a run never changes flow.
- `record_call` appends to the run's call log. Records are numbered per segment from 0
  with no gaps. A ``started`` record is refused unless its segment is the segment of the
  run's latest checkpoint (fencing): a worker that lost the run starts no new call.
- Both are atomic against every other writer the backend supports (one process for the
  memory store; every process on the host for SQLite; every client for Redis and SQL).
- Stores keep rows exactly as given and never decode payloads; checking signatures is the
  caller's job (`agentflow.exec._durable_seal`).

Optional: a store may offer ``save_after_calls(run_id, step, checkpoint, calls)``: append
`calls` in order, each under `record_call`'s rules, then save `checkpoint` under `save`'s,
as one atomic write: all of it or, if any rule refuses, nothing (`CheckpointConflict`).
A superstep whose last call finished just before its checkpoint uses it to store the
``done`` record and the checkpoint in one commit or round trip; without it, the caller
writes them one after the other. Every store agentflow ships offers it.

Optional: ``head(run_id)`` returns the latest checkpoint and the number of call records
in each segment, read no earlier than the checkpoint (Redis, SQL). A distributed
superstep uses it to see a clean handoff without reading the log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from agentflow.exec.checkpoints._records import SealedCall, SealedCheckpoint


@runtime_checkable
class CheckpointStore(Protocol):
    """Where runs keep their checkpoints and call logs."""

    #: Whether the store lives inside one process (then no shared key is required).
    in_process: bool

    async def save(self, run_id: str, step: int, checkpoint: SealedCheckpoint) -> None:
        """Store `checkpoint` as `step` of `run_id` (0 for a new run, else exactly latest + 1).

        Raises:
            CheckpointConflict: the step is taken or skips ahead, the run ended, or the run
                belongs to another flow.
            ValueError: `checkpoint` does not carry `run_id` and `step`.
        """
        ...

    async def latest(self, run_id: str) -> SealedCheckpoint:
        """Return the run's newest checkpoint.

        Raises:
            CheckpointNotFound: nothing is stored for `run_id`.
        """
        ...

    async def history(self, run_id: str) -> Sequence[SealedCheckpoint]:
        """Return every checkpoint of the run, oldest first (empty if there is none)."""
        ...

    async def list_unfinished(self, flow: str) -> Sequence[str]:
        """Return the ids of the flow's runs whose latest checkpoint is ``running`` or ``paused``."""
        ...

    async def list_runs(self, flow: str | None = None, limit: int = 1000) -> Sequence[SealedCheckpoint]:
        """Return the latest checkpoint of up to `limit` runs (of one flow, or all), newest first."""
        ...

    async def delete(self, run_id: str) -> None:
        """Remove every checkpoint and call record of the run (nothing happens if there is none)."""
        ...

    async def record_call(self, run_id: str, record: SealedCall) -> None:
        """Append `record` to the run's call log.

        Raises:
            CheckpointNotFound: the run has no checkpoint.
            CheckpointConflict: the record's position in its segment is taken or leaves a
                gap, or it is a ``started`` record whose segment is not the run's latest
                (the writer was fenced), or the run ended.
        """
        ...

    async def calls(self, run_id: str) -> Sequence[SealedCall]:
        """Return the run's call records ordered by segment, then sequence number."""
        ...

    async def aclose(self) -> None:
        """Release connections (the store can still be used again afterwards)."""
        ...
