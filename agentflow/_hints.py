"""The command an operator is told to run for a run's calls in doubt: one rule for the CLI, the viewer and the workers.

The hint depends on where the operator acts from. In process (``--app``), the command runs
what follows in the operator's own process, tools included: that is what acting in
process means. Through the workers (``--workers``, a viewer or a worker of a distributed
deployment), a hint must never name an ``--app`` command: run in the operator's shell, it
would call the tools there, without the workers' credentials and beside them. So the
distributed hint is ``agentflow decide`` through the workers, which signs the decision and
leaves every tool call to a worker.
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
    return f"agentflow recover {run_id} --app ... --rerun-in-doubt --as NAME"
