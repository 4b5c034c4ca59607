"""What the worker processes of P3 (`bench.celery_steps`) import: the agentflow app and the bare Celery app.

- ``bench._celery_apps:app``: a `FlowApp` with ``chain10``, a 10-node linear flow of one
  trivial idempotent tool (the agentflow workers' ``AGENTFLOW_APP``).
- ``bench._celery_apps:bare``: a Celery app with agentflow's configuration and one task,
  ``bench.chain_step``, that enqueues its successor (made on first access, from the
  environment's settings).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry

#: Supersteps per run (tasks per chain).
STEPS = 10

# ---- the flow the agentflow workers run (AGENTFLOW_APP=bench._celery_apps:app) -------------

registry = Registry()


@registry.tool(idempotent=True)
async def bump(n: int) -> int:
    """Add one (a trivial idempotent tool)."""
    return n + 1


class Count(BaseModel):
    """The state of one run."""

    n: int = 0


def _chain() -> Flow[Count]:
    flow = Flow("chain10", state=Count)
    for i in range(STEPS):
        flow = flow.node(f"s{i}", Call("bump", args=lambda c: {"n": c.n}, into="n"))
        if i:
            flow = flow.edge(f"s{i - 1}", f"s{i}")
    return flow.end(f"s{STEPS - 1}")


chain = _chain()
app = FlowApp(registry, [chain])

# ---- the bare Celery side (celery -A bench._celery_apps:bare worker) ----------------------

_done_client: Any = None


def make_bare_app(settings: Any) -> Any:
    """A Celery app with agentflow's configuration and one chained task, `bench.chain_step`."""
    import redis
    from celery import Celery

    from agentflow.celery._config import task_options
    from agentflow.celery._settings import WorkerSettings

    bare = Celery("bench-bare")
    bare.conf.update(settings.celery())
    options = task_options(
        WorkerSettings(time_limit_s=settings.time_limit_s, soft_time_limit_s=settings.soft_time_limit_s)
    )
    queue, done_key, url = settings.queue, f"{settings.key_prefix}:bench:done", settings.redis_url.get_secret_value()

    def chain_step(task: Any, chain_id: str, i: int, n: int) -> dict[str, Any]:
        global _done_client
        if i + 1 < n:
            registered.apply_async((chain_id, i + 1, n), task_id=f"bc-{chain_id}-{i + 1}", queue=queue)
        else:
            if _done_client is None:
                _done_client = redis.Redis.from_url(url)
            _done_client.incr(done_key)
        return {"chain": chain_id, "step": i, "done": "ran"}

    # Registered by a call, as agentflow's own tasks are, not by decorator: Celery ships no types.
    registered: Any = bare.task(name="bench.chain_step", **options)(chain_step)
    bare.conf.task_routes = {"bench.*": {"queue": queue}}
    return bare


def __getattr__(name: str) -> Any:
    if name == "bare":
        from config import load_settings

        globals()["bare"] = built = make_bare_app(load_settings())
        return built
    raise AttributeError(f"module 'bench._celery_apps' has no attribute {name!r}")
