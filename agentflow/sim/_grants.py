"""Grants: a call that may have happened is started again only on a signed grant, checked at its ``started``.

The ledger's invariant (`World.effect`) sees a call run twice only once its effect happened
twice: a worker that crashed after ``started`` but before the effect, or whose tool was
withheld (`LeaseLost`), leaves a call in doubt whose rerun without a decision does no
visible harm in that episode, though the protocol broke its promise (a call that may have
happened never runs again on its own). So each ``started`` the store accepts is judged as
it is written: it is the moment a call may happen, whatever happens after.

Moving parts (`Grants`, fed every accepted write, in order, by the world):
- a call is *guarded* while its newest stored ``started`` signed ``"idempotent": false``
  (the signed record, not the tools deployed now: what the call was when that start began;
  a start under a deploy that declares the tool idempotent lets the next one go free, as
  the ledger's rule counts an effect by the flags its start had);
- each further ``started`` of a guarded call spends a *grant*, stored before it: a claim's
  signed ``rerun`` decision naming the call, or a ``retry`` claim while the call's newest
  record was ``failed`` with no ``done`` of its own stored (an operator's "did not happen",
  then a retry of the run: `_operator`'s rule, read here from the writes themselves);
- a ``started`` with no grant left is the broken invariant.

Invariants: only the writes decide (nothing of the code under test is asked); not checked
once the store lost acknowledged writes (the world's `_judge` drops what it reports then).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Grants:
    """Per run and call: whether it is guarded, its grants left, its newest record's kind and whether it is done."""

    guarded: set[tuple[str, str]] = field(default_factory=set)
    left: Counter[tuple[str, str]] = field(default_factory=Counter)
    newest: dict[tuple[str, str], str] = field(default_factory=dict)
    done: set[tuple[str, str]] = field(default_factory=set)

    def call(self, run_id: str, kind: str, body: Mapping[str, Any]) -> str | None:
        """A call record was stored: the rule it broke (a rerun nobody granted), or None."""
        call_id = body.get("call_id")
        if not isinstance(call_id, str):
            return None
        key = (run_id, call_id)
        self.newest[key] = kind
        if kind == "done":
            self.done.add(key)
        if kind != "started":
            return None
        guarded = key in self.guarded  # its previous start signed it not idempotent
        if body.get("idempotent") is False:
            self.guarded.add(key)
        else:
            self.guarded.discard(key)  # started again under a deploy that declares it idempotent: reruns freely
        if not guarded:
            return None
        if self.left[key] <= 0:
            return (
                f"{body.get('tool')} {call_id} of {run_id} was started again with no signed grant to rerun it "
                "(no rerun decision, no retry of it failed): a call that may have happened ran again on its own"
            )
        self.left[key] -= 1
        return None

    def checkpoint(self, run_id: str, body: Mapping[str, Any]) -> None:
        """A checkpoint was stored: the grants it signs (a rerun decision; a retry of the calls failed by then)."""
        for call_id in body.get("rerun") or ():
            self.left[(run_id, str(call_id))] += 1
        if body.get("claim") == "retry":
            for key, kind in self.newest.items():
                if key[0] == run_id and kind == "failed" and key not in self.done:
                    self.left[key] += 1
