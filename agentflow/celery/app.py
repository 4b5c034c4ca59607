"""`make_app`: a deployment's Celery app and agentflow's tasks on it, from your flows, agents and settings.

The module a fleet runs (``celery -A mymodule worker -B``, ``celery -A mymodule flower``) is
yours, and ten lines long::

    from agentflow.celery import make_app
    from my_company.support import durable_agent, refund_flow, registry

    app, tasks = make_app(flows=[refund_flow], registry=registry, agents={"support": durable_agent})

Its clients import the same module (``FlowClient(tasks)``; ``agentflow decide ... --workers
mymodule:tasks``), so workers and clients are built from one place with the same settings.

Invariants:
- The settings are `Settings` (``AGENTFLOW_*`` variables, ``.env``), read when the app is
  made unless given; keyword values override single settings. Invalid settings, a store URL
  the store opener refuses, or nothing to run stop the process with one message saying what
  to fix (`SystemExit`), before any worker forks.
- The store URL gets the deployment's key prefix, TTL and durability options wherever it
  names none (`store_url`); nothing connects until a worker process first uses its store.
- Metrics and tracing are wired only when the settings ask for them (their extras are
  imported then, and only then). This module is wiring: the tasks themselves never import
  the observers (the ``observe`` layer contract ignores only this module's imports).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit

from celery import Celery

from agentflow._app import FlowApp, LoopHost, load_app
from agentflow.celery._deployment import Settings, load_settings
from agentflow.celery._tasks import AgentflowTasks, register_tasks
from agentflow.exec import Registry
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.checkpoints.urls import open_store
from agentflow.flow import Flow

#: What `make_app` says when it has nothing to run.
NOTHING_TO_RUN = (
    "make_app has nothing to run: give it your flows and agents "
    "(make_app(flows=[...], registry=registry, agents={'support': DurableAgent(agent)})), "
    "a FlowApp (make_app(app)), or set AGENTFLOW_APP=package.module:attribute naming one"
)


class Fleet(NamedTuple):
    """What `make_app` returns: ``app, tasks = make_app(...)``."""

    app: Celery
    """The Celery app ``celery -A yourmodule`` finds (as the module's ``app``)."""
    tasks: AgentflowTasks
    """agentflow's task handles on it: what `FlowClient` and ``--workers yourmodule:tasks`` take."""


def make_app(
    app: FlowApp | None = None,
    *,
    flows: Iterable[Flow[Any]] = (),
    registry: Registry | None = None,
    agents: Mapping[str, LoopHost] | None = None,
    settings: Settings | None = None,
    name: str = "agentflow-workers",
    **values: Any,
) -> Fleet:
    """Build the Celery app of a deployment and register agentflow's tasks on it.

    Args:
        app: a `FlowApp` bundling your flows, tools and loops; or leave it out and give them:
        flows: the flows the workers run (their tools on `registry`).
        registry: the tools of `flows` (default: an empty one, for agents alone).
        agents: durable agents (`agentflow.integrations.pydantic_ai.DurableAgent`) or tool
            loops (`LoopSpec`), by the name runs start them under (`FlowClient.start_agent`).
        settings: the deployment's settings (default: read from ``AGENTFLOW_*`` and ``.env``).
        name: the Celery app's main name.
        **values: single settings over the environment's (``lease_s=5.0``), instead of `settings`.

    Returns:
        The Celery app and the task handles (`Fleet`, a pair).

    Raises:
        TypeError: both `app` and flows, registry or agents; or both `settings` and `values`.
        SystemExit: invalid settings, a store URL that cannot be opened, or nothing to run
            (the message says what to fix).
    """
    if settings is not None and values:
        raise TypeError(f"make_app: give settings or single values ({', '.join(sorted(values))}), not both")
    settings = settings if settings is not None else load_settings(**values)
    flow_app = _flow_app(app, list(flows), registry, agents, settings)
    celery_app = Celery(name)
    celery_app.conf.update(settings.celery())
    tasks = register_tasks(
        celery_app,
        flow_app,
        store_factory=store_factory(settings),
        checkpoint_key=settings.keys(),
        settings=settings.worker(),
    )
    _observe(celery_app, tasks, settings)
    return Fleet(celery_app, tasks)


def _flow_app(
    app: FlowApp | None,
    flows: list[Flow[Any]],
    registry: Registry | None,
    agents: Mapping[str, LoopHost] | None,
    settings: Settings,
) -> FlowApp:
    """The `FlowApp` to run: the one given, one of the flows and agents given, or ``AGENTFLOW_APP``'s."""
    given = flows or registry is not None or agents
    if app is not None:
        if given:
            raise TypeError("make_app: give a FlowApp or flows, registry and agents, not both")
        return app
    if given:
        return FlowApp(registry or Registry(), flows, loops=agents)
    if not settings.app.strip():
        raise SystemExit(NOTHING_TO_RUN)
    try:
        return load_app(settings.app)
    except ValueError as exc:
        raise SystemExit(f"AGENTFLOW_APP: {exc}") from None


def store_url(settings: Settings) -> str:
    """The store URL with the deployment's prefix, durability options and (Redis) TTL wherever the URL names none."""
    url = settings.store()
    scheme, query = urlsplit(url).scheme, urlsplit(url).query
    given = dict(parse_qsl(query, keep_blank_values=True))
    volatile = {"allow_volatile": "1" if settings.store_allow_volatile else "0"}
    if scheme in ("redis", "rediss", "redis+sentinel"):
        defaults = {"prefix": settings.key_prefix, "ttl_s": str(settings.ttl_s), **volatile}
        defaults["wait_replicas"] = str(settings.store_wait_replicas)
        defaults["wait_fsync"] = "1" if settings.store_wait_fsync else "0"
        defaults["wait_timeout_s"] = str(settings.store_wait_timeout_s)
    elif scheme == "postgresql+asyncpg":
        defaults = {"table_prefix": f"{settings.key_prefix.lower().replace('-', '_')}_", **volatile}
    else:
        defaults = {"table_prefix": f"{settings.key_prefix.lower().replace('-', '_')}_"}
    missing = {k: v for k, v in defaults.items() if k not in given}
    if not missing:
        return url
    return f"{url}{'&' if query else '?'}{urlencode(missing)}"


def store_factory(settings: Settings) -> Callable[[], CheckpointStore]:
    """What makes each worker process's store (nothing connects until it is first used).

    Raises:
        SystemExit: the store URL is not one the store opener accepts (the message says why).
    """
    url = store_url(settings)
    try:
        open_store(url, must_exist=False)  # refuse a bad URL at start, not in the first task
    except ValueError as exc:
        raise SystemExit(f"AGENTFLOW_STORE_URL: {exc}") from None
    return lambda: open_store(url, must_exist=False)


def _observe(celery_app: Celery, tasks: AgentflowTasks, settings: Settings) -> None:
    """Serve the worker's metrics and trace its runs, where the settings ask for them."""
    if settings.metrics_port:
        from agentflow.observe.celery import serve_worker_metrics  # the metrics extra, only when asked for

        serve_worker_metrics(celery_app, tasks, port=settings.metrics_port, host=settings.metrics_host)
    if settings.tracing:
        from agentflow.observe import trace_worker  # the otel extra, only when asked for

        trace_worker(tasks.worker)
