"""The fleet's app module: ``celery -A fleet_app worker -B``, ``celery -A fleet_app flower``; clients import `tasks`.

Settings come from ``AGENTFLOW_*`` variables (or ``.env``): the checkpoint key, the Redis URL, ...
"""

from support import durable

from agentflow.celery import make_app

app, tasks = make_app(agents={"support": durable})
