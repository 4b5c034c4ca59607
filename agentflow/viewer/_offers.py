"""What the run page offers: each action's button, enabled with its form's CSRF token, or disabled with why not."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from agentflow.exec.run.view import RunReport
from agentflow.viewer._guards import client_refusal, csrf_token
from agentflow.viewer._rules import CANCEL, DECIDE, FORK, RESUME, RETRY, Rule
from agentflow.viewer._settings import Viewer


@dataclass(frozen=True)
class Offer:
    """One action on the run page."""

    shown: bool = False
    """Whether the page shows it (the run's state fits it, and the viewer can act at all)."""
    why_not: str = ""
    """Why it is disabled (shown next to it)."""
    csrf: str = ""
    """The form's CSRF token (only when it is enabled)."""

    @property
    def allowed(self) -> bool:
        """Whether its button is enabled."""
        return bool(self.csrf)


@dataclass(frozen=True)
class Offers:
    """Every action the run page offers for one run, to one client."""

    resume: Offer
    cancel: Offer
    retry: Offer
    decide: Offer
    fork: Offer
    needs_token: bool
    """Whether the forms ask for the viewer's token."""

    @property
    def operate(self) -> bool:
        """Whether the page's "Act on this run" section has anything to show (Cancel, Retry, Fork)."""
        return self.cancel.shown or self.retry.shown or self.fork.shown


def offers(viewer: Viewer, request: Request, report: RunReport) -> Offers:
    """What the run page offers for `report` to the client of `request`."""
    client = client_refusal(viewer, request)

    def offer(rule: Rule) -> Offer:
        if rule.fits(report) is not None:
            return Offer()
        if viewer.flows is None and rule is not RESUME:
            return Offer()  # read-only: no buttons (Approve and Deny stay, disabled, saying how to enable them)
        why = rule.refusal(viewer, report) or client
        if why:
            return Offer(True, why)
        return Offer(True, csrf=csrf_token(viewer, rule.name, report.run_id, report.step))

    return Offers(
        offer(RESUME), offer(CANCEL), offer(RETRY), offer(DECIDE), offer(FORK), viewer.settings.token is not None
    )
