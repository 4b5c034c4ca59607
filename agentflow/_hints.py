"""The command an operator is told to run for a run's calls in doubt: one rule for the CLI, the viewer and the workers.

A call in doubt may have had its effect (a charge, a mail) before its worker died. So no hint
ever says to run such calls again wholesale (``recover --rerun-in-doubt``): every hint is
``agentflow decide``, which asks, per call, what the operator found at the call's system
(``rerun``, ``happened:JSON`` with the result it had, or ``not:REASON``).

The hint depends on where the operator acts from. In process (``--app``), ``decide`` stores
the decision and ``recover`` then acts on it in the operator's own process, tools included:
that is what acting in process means. Through the workers (``--workers``, a viewer or a worker
of a distributed deployment), a hint must never name an ``--app`` command: run in the
operator's shell, it would call the tools there, without the workers' credentials and beside
them. So the distributed hint is ``agentflow decide`` through the workers, which signs the
decision and leaves every tool call to a worker.
"""

from __future__ import annotations

#: The ``--call`` argument of ``agentflow decide``, one per call in doubt.
CALL_WORDS = "--call CALL_ID=rerun|happened:JSON|not:REASON"


def decide_hint(run_id: str, *, workers: str | None) -> str:
    """What to run once the calls in doubt were checked at their systems.

    `workers`: the ``--workers`` value of the deployment (``"..."`` when it is distributed but
    the value is not known here); None when the operator acts in process.
    """
    if workers is not None:
        return f"agentflow decide {run_id} --workers {workers} {CALL_WORDS} --as NAME"
    return f"agentflow decide {run_id} --app ... {CALL_WORDS} --as NAME, then agentflow recover {run_id} --app ..."
