#!/usr/bin/env bash
# Make sure the Redis, PostgreSQL and RabbitMQ servers the tests use answer on 127.0.0.1.
# Starts them when they are installed but stopped; says so when they are missing (the
# tests then skip locally, and fail when CI is set).
set -u
if command -v redis-cli >/dev/null 2>&1; then
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    echo "services: starting redis-server on 127.0.0.1:6379"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null || true
    for _ in $(seq 1 50); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
else
  echo "services: redis-server is not installed; Redis tests will skip (or fail under CI)"
fi
if command -v pg_isready >/dev/null 2>&1; then
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    echo "services: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start 2>/dev/null \
      || pg_ctlcluster "$(ls /etc/postgresql | head -1)" main start || true
    for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
  fi
else
  echo "services: PostgreSQL is not installed; PostgreSQL tests will skip (or fail under CI)"
fi
if command -v rabbitmqctl >/dev/null 2>&1; then
  # `await_startup` waits until the node runs its app; a stopped app (stop_app) is started too.
  if ! rabbitmqctl -q await_startup --timeout 2 >/dev/null 2>&1; then
    if rabbitmqctl -q ping >/dev/null 2>&1; then  # the node answers: only its app is stopped
      echo "services: starting the RabbitMQ application"
      rabbitmqctl -q start_app >/dev/null 2>&1 || true
    else
      echo "services: starting rabbitmq-server"
      rabbitmq-server -detached >/dev/null 2>&1 || true
      # await_startup gives up at once while the new node is not registered yet: wait for it first.
      for _ in $(seq 1 60); do rabbitmqctl -q ping >/dev/null 2>&1 && break; sleep 0.5; done
    fi
    rabbitmqctl -q await_startup --timeout 60 >/dev/null 2>&1 || echo "services: RabbitMQ did not start"
  fi
else
  echo "services: RabbitMQ is not installed; RabbitMQ tests will skip (or fail under CI)"
fi
exit 0
