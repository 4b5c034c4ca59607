# One image for the worker, beat and flower services of docker-compose.yml.
#   docker compose build && docker compose up -d
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app

WORKDIR /app

# The library with the celery extra (Celery, kombu, Flower, redis-py, pydantic-settings).
COPY pyproject.toml README.md ./
COPY agentflow ./agentflow
RUN pip install ".[celery]"

# The runnable app (wiring) and its settings; `celery -A workers` imports them from /app.
# Only these paths are copied: a local .env never ends up in the image.
COPY workers ./workers
COPY config ./config

# Run as an unprivileged user; beat keeps its schedule file under /var/lib/agentflow.
RUN useradd --system --uid 10001 --home-dir /var/lib/agentflow --shell /usr/sbin/nologin agentflow \
    && mkdir -p /var/lib/agentflow \
    && chown agentflow:agentflow /var/lib/agentflow
USER agentflow

CMD ["celery", "-A", "workers", "worker", "-l", "INFO"]
