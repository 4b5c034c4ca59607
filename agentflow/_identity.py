"""Who a run is for: `RunContext`, and the checks that keep a run with its owner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentflow._errors import IdentityMismatch

if TYPE_CHECKING:
    from agentflow.exec.seal import Sealer


@dataclass(frozen=True, slots=True)
class RunContext:
    """The end user, conversation thread and credential a run acts for."""

    user: str | None = None
    """The end user the run acts for."""
    thread: str | None = None
    """The conversation or thread the run belongs to."""
    principal: str | None = field(default=None, repr=False)
    """A credential (e.g. a token). Never stored: checkpoints keep only a proof of it."""


def identity_body(sealer: Sealer | None, run_id: str, ctx: RunContext | None) -> dict[str, Any]:
    """Return what a checkpoint stores of `ctx` (the principal only as a keyed proof)."""
    if ctx is None:
        return {"user": None, "thread": None, "principal": None}
    proof = None
    if ctx.principal is not None and sealer is not None:  # without a store nothing is stored at all
        proof = sealer.principal_proof(run_id, ctx.principal)
    return {"user": ctx.user, "thread": ctx.thread, "principal": proof}


def restore_identity(sealer: Sealer, run_id: str, stored: dict[str, Any], ctx: RunContext | None) -> RunContext:
    """Check `ctx` against the stored identity and return the context to continue with.

    Without `ctx` the stored user and thread come back; a run that had a principal cannot
    continue without it.

    Raises:
        IdentityMismatch: `ctx` is for another user or thread, or the principal is missing or wrong.
    """
    user, thread, proof = stored.get("user"), stored.get("thread"), stored.get("principal")
    if ctx is not None:
        if ctx.user is not None and ctx.user != user:
            raise IdentityMismatch(f"run {run_id!r} belongs to another user; the ctx given is for {ctx.user!r}")
        if ctx.thread is not None and ctx.thread != thread:
            raise IdentityMismatch(f"run {run_id!r} belongs to another thread; the ctx given is for {ctx.thread!r}")
    principal = ctx.principal if ctx is not None else None
    if proof is not None:
        if principal is None:
            raise IdentityMismatch(f"run {run_id!r} acts for a principal: pass ctx=RunContext(principal=...) to go on")
        if not sealer.principal_matches(run_id, proof, principal):
            raise IdentityMismatch(f"run {run_id!r}: the principal given is not the one the run was started with")
    elif principal is not None:
        raise IdentityMismatch(f"run {run_id!r} was started without a principal; one cannot be added on recovery")
    return RunContext(user=user, thread=thread, principal=principal)
