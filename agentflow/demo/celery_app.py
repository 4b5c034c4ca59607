"""The app the distributed demo's workers run: ``celery -A agentflow.demo.celery_app worker``.

Built on import from the environment the demo gives its workers (see `agentflow.demo._celery`).
"""

from agentflow.demo._celery import build, demo_prefix, redis_url

app, tasks = build(redis_url(), demo_prefix())
