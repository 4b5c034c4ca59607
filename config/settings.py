"""The repository's deployment settings: `agentflow.celery.Settings`, with the app required.

``celery -A workers`` (the Dockerfile, docker-compose.yml) finds its flows and tools through
``AGENTFLOW_APP`` alone, so here an unset one stops the worker at start with a message saying
what to set. Every other setting, and every check of them, is the package's
(`agentflow.celery.Settings`: ``AGENTFLOW_*`` variables or ``.env``).
"""

from __future__ import annotations

from agentflow.celery import Settings as PackageSettings
from agentflow.celery import load_settings as load

#: Why the settings refuse an unset ``AGENTFLOW_APP``, and what to set.
APP_NOT_SET = (
    "AGENTFLOW_APP is not set: set it to the FlowApp of your flows and tools that the workers run, "
    "as package.module:attribute, e.g. AGENTFLOW_APP=my_company.agents:app "
    "(or agentflow.demo.tickets:app to try the deployment with the demo's ticket flow)"
)


class Settings(PackageSettings):
    """Everything a worker, beat or Flower process of ``celery -A workers`` needs to know."""

    def _more_problems(self) -> list[str]:
        return [] if self.app.strip() else [APP_NOT_SET]


def load_settings() -> Settings:
    """Read the settings, turning a validation failure into one clear message.

    Raises:
        SystemExit: the settings are invalid (the message says what to fix).
    """
    return load(Settings)
