"""`Settings`: a deployment's workers, beat, Flower and clients, from ``AGENTFLOW_*`` variables (or ``.env``).

What `agentflow.celery.make_app` builds a fleet from; the repository's own ``config`` package
is a thin use of it. These settings are the production wiring: nothing in them defaults to
the demo's.

- The checkpoint key has no default: a missing, short, patterned (``"a" * 32``) or ambiguous
  (hex digits without ``hex:``) ``AGENTFLOW_CHECKPOINT_KEYS`` stops the worker at start with
  a message saying how to make one (`agentflow._keys.parse_keys`). The demo's public key is
  refused too.
- ``AGENTFLOW_APP`` (the `FlowApp` as an import path) is read here but not required: an app
  module that hands its flows and agents to `make_app` needs none, and `make_app` says what
  to give when neither is there. (The demo does not read these settings: ``python -m
  agentflow.demo`` builds its own app, key and prefix.)

Every problem found is reported at once, in one message.

The broker and the store are named apart (``AGENTFLOW_BROKER_URL``, ``AGENTFLOW_STORE_URL``);
each one left unset is ``AGENTFLOW_REDIS_URL``, so one Redis stays the default for both.
The store URL picks the store as the ``agentflow`` command's ``--store`` does; leases (and
everything else about a run) live there, never in the broker.

No secret shows in ``repr`` or ``str`` of the settings: the URLs (they may hold a
password) and the keys are `SecretStr`. A URL's password is written percent-encoded
(``%2F`` for ``/``); one holding a raw ``/``, ``?``, ``#`` or ``@`` is refused here, with the
URL shown redacted (`agentflow._urls.redact`).
"""

from __future__ import annotations

from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentflow._keys import MAKE_ONE, parse_keys
from agentflow._urls import check_user_part
from agentflow.celery._config import AMQP_SCHEMES, REDIS_SCHEMES, SENTINEL_SCHEME, is_rabbitmq
from agentflow.celery._settings import WorkerSettings
from agentflow.celery._tasks import celery_config

#: Store URL schemes of the SQL store (`agentflow.exec.checkpoints.urls.open_store` opens them).
SQL_SCHEMES = ("postgresql+asyncpg", "sqlite+aiosqlite")


class Settings(BaseSettings):
    """Everything a worker, beat or Flower process needs to know."""

    model_config = SettingsConfigDict(
        env_prefix="AGENTFLOW_", env_file=".env", extra="ignore", hide_input_in_errors=True
    )

    app: str = ""
    """Import path of the `FlowApp` (flows and tools) the workers run, as ``package.module:attribute``.

    Empty: not set (`make_app` then needs the flows and agents themselves).
    """
    redis_url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    """The Redis of the broker and the store when they are not named apart (may hold a password: never logged).

    With a RabbitMQ broker, set it only to keep Celery's task results there (else there are none).
    """
    broker_url: SecretStr | None = None
    """The Celery broker: ``redis://...``, or RabbitMQ's ``amqp://user:password@host:5672/vhost`` (unset: `redis_url`).

    With RabbitMQ: quorum queues, native delayed delivery, results off the broker (`agentflow.celery.celery_config`).
    """
    store_url: SecretStr | None = None
    """The checkpoint store, its leases included (unset: `redis_url`).

    ``redis://...``, ``postgresql+asyncpg://user@host/db`` or ``sqlite+aiosqlite:///path.db``
    (the SQL store on SQLite: portable, slower than `SQLiteCheckpointStore`);
    a SQL store's tables are named ``<key_prefix>_...`` unless the URL says ``?table_prefix=``,
    a Redis store's keys ``<key_prefix>:...`` unless it says ``?prefix=``.
    """
    store_wait_replicas: int = Field(default=0, ge=0)
    """A Redis store's ``wait_replicas``: the writes a run's promise stands on return once so many replicas have them.

    Those writes are a non-idempotent call's ``started`` (the tool does not run before), a
    run's step 0 and every claim (each signed decision). 0: once the primary has them, and
    a failover can lose the last ones (docs/stores/redis.md, Failover and durability).
    """
    store_wait_fsync: bool = False
    """A Redis store's ``wait_fsync``: those writes also wait for the append-only file's fsync (Redis 7.2+ / Valkey)."""
    store_wait_timeout_s: float = Field(default=1.0, gt=0, le=3600)
    """How long those writes wait; unacknowledged, the superstep stops there (`StoreNotDurable`) and is tried again."""
    store_retries: int = Field(default=5, ge=0)
    """How often a superstep stopped by `StoreNotDurable` is sent again, with a back-off, before recover_all has it."""
    store_retry_s: float = Field(default=1.0, gt=0)
    """The first back-off of such a retry (doubled each time)."""
    store_allow_volatile: bool = False
    """Start on a store that keeps nothing on disk (Redis without AOF or snapshots, and no replica waited for).

    Refused by default, with a message: a restart of such a server loses every run and every
    call's ``started`` record. Set it (``AGENTFLOW_STORE_ALLOW_VOLATILE=1``) when that is on purpose.
    """
    checkpoint_keys: SecretStr | None = None
    """One key or a comma-separated list, newest first: ``hex:...``, ``base64:...`` or text."""
    key_prefix: str = "agentflow"
    """Prefix of every Redis key (checkpoints, leases, broker): one per tenant."""
    queue: str = "agentflow"
    sweep_queue: str | None = None
    """The queue of recover_all's messages, which every worker consumes besides ``-Q`` (unset: ``<queue>.sweep``)."""
    lease_s: float = 30.0
    ttl_s: int = 7 * 24 * 3600
    visibility_timeout_s: int = 3600
    time_limit_s: int = 900
    soft_time_limit_s: int = 840
    recover_interval_s: float = 60.0
    stale_after_s: float = 10.0
    recover_lock_s: float = 10.0
    recheck_margin_s: float = 1.0
    """A run found held is looked at again this long after its lease was due to end."""
    recover_sweep: bool = False
    """recover_all also finds runs the listing index forgot, by scanning the stored keys."""
    retention_days: float | None = Field(default=None, gt=0)
    """Finished runs last saved longer ago than this are pruned by beat's ``agentflow.prune_finished`` (unset: never).

    On top of the store's TTL (``ttl_s``), which expires any run but a paused one this long
    after its last write.
    """
    retention_trim_days: float | None = Field(default=None, gt=0)
    """Finished runs last saved longer ago than this keep only their newest checkpoint (unset: every checkpoint).

    The same beat task trims them after its prune; shorter than ``retention_days`` when both are set.
    """
    retention_interval_s: float = Field(default=3600.0, gt=0)
    """How often beat sends ``agentflow.prune_finished`` (when ``retention_days`` or ``retention_trim_days`` is set)."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Serve the worker's Prometheus metrics at ``http://<metrics_host>:<port>/metrics`` (0: off).

    Needs the ``metrics`` extra and ``PROMETHEUS_MULTIPROC_DIR`` (an existing directory of the
    worker's own) in the worker's environment: see docs/observability.md. One port per worker
    on a host. Beat and Flower never serve them.
    """
    metrics_host: str = "127.0.0.1"
    """The address the metrics endpoint binds: the loopback interface unless you say otherwise."""
    tracing: bool = False
    """Report every run's spans to OpenTelemetry (``AGENTFLOW_TRACING=1``; needs the ``otel`` extra).

    The spans go to the global tracer provider, which the worker's app configures (an SDK
    and an exporter, e.g. OTLP to a collector): see docs/observability.md.
    """

    @field_validator("retention_days", "retention_trim_days", "broker_url", "store_url", "sweep_queue", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """An empty value (as ``.env.example`` has) is unset: finished runs are kept, a URL is `redis_url`."""
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _check(self) -> Settings:
        problems = []
        try:
            self.keys()
        except ValueError as exc:
            problems.append(str(exc))
        problems.extend(self._more_problems())
        problems.extend(self._url_problems())
        if not is_rabbitmq(self.broker()) and self.visibility_timeout_s < 2 * self.time_limit_s:
            problems.append(
                "AGENTFLOW_VISIBILITY_TIMEOUT_S must be at least twice AGENTFLOW_TIME_LIMIT_S, "
                "or Redis redelivers supersteps that are still running"
            )
        days, trim = self.retention_days, self.retention_trim_days
        if days is not None and trim is not None and not trim < days:
            problems.append("AGENTFLOW_RETENTION_TRIM_DAYS must be shorter than AGENTFLOW_RETENTION_DAYS (or unset)")
        if self.sweep_queue == self.queue:
            problems.append("AGENTFLOW_SWEEP_QUEUE must differ from AGENTFLOW_QUEUE (or be unset: <queue>.sweep)")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _more_problems(self) -> list[str]:
        """What a deployment's own settings refuse besides (none here; the repository's ``config`` needs an app)."""
        return []

    def broker(self) -> str:
        """The broker's URL: `broker_url`, else `redis_url`."""
        return (self.broker_url or self.redis_url).get_secret_value()

    def store(self) -> str:
        """The checkpoint store's URL: `store_url`, else `redis_url`."""
        return (self.store_url or self.redis_url).get_secret_value()

    def _url_problems(self) -> list[str]:
        problems = []
        for name, url in (
            ("REDIS_URL", self.redis_url),
            ("BROKER_URL", self.broker_url),
            ("STORE_URL", self.store_url),
        ):
            try:
                check_user_part("" if url is None else url.get_secret_value(), f"AGENTFLOW_{name}")
            except ValueError as exc:
                problems.append(str(exc))
        if problems:  # the others would read the URLs wrong
            return problems
        if urlsplit(self.broker()).scheme not in (*REDIS_SCHEMES, SENTINEL_SCHEME, *AMQP_SCHEMES):
            problems.append(
                "AGENTFLOW_BROKER_URL must be a redis://, rediss://, redis+sentinel://, amqp:// or amqps:// URL"
            )
        if urlsplit(self.store()).scheme not in (*REDIS_SCHEMES, SENTINEL_SCHEME, *SQL_SCHEMES):
            problems.append(
                "AGENTFLOW_STORE_URL must be a redis://, rediss://, redis+sentinel://, postgresql+asyncpg:// or "
                "sqlite+aiosqlite:// URL"
            )
        return problems

    def result_backend(self) -> str | None:
        """Where Celery keeps task results: the broker's Redis; with RabbitMQ, `redis_url` if set, else nowhere."""
        if not is_rabbitmq(self.broker()):
            return self.broker()
        return self.redis_url.get_secret_value() if "redis_url" in self.model_fields_set else None

    def keys(self) -> list[bytes]:
        """The checkpoint keys, newest first.

        Raises:
            ValueError: no key, or a malformed, short, patterned or ambiguous one, or the
                demo's public key (the message never contains a key).
        """
        if self.checkpoint_keys is None:
            raise ValueError(
                f"AGENTFLOW_CHECKPOINT_KEYS is not set: give every worker the same secret of 32+ random bytes; "
                f"{MAKE_ONE}"
            )
        return parse_keys(self.checkpoint_keys.get_secret_value(), source="AGENTFLOW_CHECKPOINT_KEYS")

    def celery(self) -> dict[str, Any]:
        """The Celery configuration (`agentflow.celery.celery_config` of these settings)."""
        return celery_config(
            self.broker(),
            key_prefix=self.key_prefix,
            queue=self.queue,
            visibility_timeout_s=self.visibility_timeout_s,
            result_backend=self.result_backend(),
        )

    def worker(self) -> WorkerSettings:
        """How the workers pace and guard runs (`WorkerSettings`), from these settings."""
        return WorkerSettings(
            lease_s=self.lease_s,
            stale_after_s=self.stale_after_s,
            recover_lock_s=self.recover_lock_s,
            recheck_margin_s=self.recheck_margin_s,
            store_retries=self.store_retries,
            store_retry_s=self.store_retry_s,
            recover_interval_s=self.recover_interval_s,
            sweep_forgotten=self.recover_sweep,
            retention_days=self.retention_days,
            retention_trim_days=self.retention_trim_days,
            retention_interval_s=self.retention_interval_s,
            time_limit_s=self.time_limit_s,
            soft_time_limit_s=self.soft_time_limit_s,
            queue=self.queue,
            sweep_queue=self.sweep_queue,
        )


S = TypeVar("S", bound=Settings)


def load_settings(kind: type[S] = Settings, **values: Any) -> S:  # type: ignore[assignment]
    """Read the settings of `kind` (``AGENTFLOW_*``, ``.env``; `values` win), turning a failure into one clear message.

    Raises:
        SystemExit: the settings are invalid (the message says what to fix).
    """
    try:
        return kind(**values)
    except ValidationError as exc:
        problems = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in exc.errors())
        raise SystemExit(f"agentflow settings: {problems}") from None
