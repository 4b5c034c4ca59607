"""No password in any error, log line, repr or output, whatever URL it came in; percent-encoded ones log in.

Every URL form agentflow takes is driven down every error path of reading it (bad scheme,
missing host, bad port, bad database, bad Sentinel primary name, unknown parameter, a server
that does not answer) through each door: the stores built in code, ``--store`` on the command
line, the workers' settings, the Celery broker and the viewer's settings. The password holds
every character a URL reserves (`_kit.secrets.url_password`), written raw (refused before any
parser reads it) and percent-encoded; every message, log record, repr and line of output is
scanned for it whole, percent-encoded and piece by piece (`_kit.secrets.leaks`).

Percent-encoded passwords log in to real servers of our own (a Redis and a Sentinel started
with passwords, never the shared ones reconfigured): the store and the broker alike, a
``sentinel_password`` with a raw ``+`` included.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from _kit.ports import free_port
from _kit.replication import SERVICE, Server, server_binary, start_sentinel
from _kit.secrets import leaks, url_password
from celery import Celery
from kombu.exceptions import OperationalError
from pydantic import ValidationError

from agentflow._urls import check_user_part, redact
from agentflow.celery import celery_config
from agentflow.exec.checkpoints import MemoryCheckpointStore, RedisCheckpointStore, SQLAlchemyCheckpointStore
from agentflow.viewer import ViewerSettings
from config import Settings
from config.settings import load_settings

#: The primary's password and the Sentinels' own, each holding / # ? @ : +.
PASSWORD = url_password()
SENTINEL_PASSWORD = url_password()
SECRETS = [("password", PASSWORD), ("sentinel_password", SENTINEL_PASSWORD)]
#: As a person writes them in a URL: percent-encoded (a + may stay raw in a query: it is kept).
ENCODED = quote(PASSWORD, safe="")
SENTINEL_ENCODED = quote(SENTINEL_PASSWORD, safe="+")
RAW_SENTINEL_QUERY = f"sentinel_password={SENTINEL_PASSWORD}"
KEYS = "hex:" + secrets.token_hex(32)

#: A URL of each form, its user part not percent-encoded: refused before anything parses it.
RAW = {
    "redis": f"redis://u:{PASSWORD}@127.0.0.1:1/0",
    "rediss": f"rediss://:{PASSWORD}@127.0.0.1:1/0",
    "sentinel": f"redis+sentinel://:{PASSWORD}@127.0.0.1:1/{SERVICE}/0?{RAW_SENTINEL_QUERY}",
    "postgres": f"postgresql+asyncpg://u:{PASSWORD}@127.0.0.1:1/db",
    "amqp": f"amqp://u:{PASSWORD}@127.0.0.1:1//",
}
#: Store URLs written right but wrong in another way, each down one error path.
STORE_ERRORS = {
    "bad scheme": f"redix://u:{ENCODED}@127.0.0.1:1/0",
    "bad SQL scheme": f"mysql+aiomysql://u:{ENCODED}@127.0.0.1:1/db",
    "sync driver": f"postgresql://u:{ENCODED}@127.0.0.1:1/db",
    "redis bad port": f"redis://:{ENCODED}@127.0.0.1:port/0",
    "redis bad db": f"redis://:{ENCODED}@127.0.0.1:1/zero",
    "sentinel missing host": f"redis+sentinel://:{ENCODED}@/{SERVICE}/0?sentinel_password={SENTINEL_ENCODED}",
    "sentinel bad port": f"redis+sentinel://:{ENCODED}@127.0.0.1:port/{SERVICE}/0?{RAW_SENTINEL_QUERY}",
    "sentinel bad db": f"redis+sentinel://:{ENCODED}@127.0.0.1:1/{SERVICE}/zero?{RAW_SENTINEL_QUERY}",
    "sentinel no primary name": f"redis+sentinel://:{ENCODED}@127.0.0.1:1/?{RAW_SENTINEL_QUERY}",
    "sentinel unknown parameter": f"redis+sentinel://:{ENCODED}@127.0.0.1:1/{SERVICE}?{RAW_SENTINEL_QUERY}&x=1",
    "postgres bad port": f"postgresql+asyncpg://u:{ENCODED}@127.0.0.1:port/db",
    "redis unreachable": f"redis://:{ENCODED}@127.0.0.1:1/0",
    "sentinel unreachable": f"redis+sentinel://:{ENCODED}@127.0.0.1:1/{SERVICE}/0?{RAW_SENTINEL_QUERY}",
    "postgres unreachable": f"postgresql+asyncpg://u:{ENCODED}@127.0.0.1:1/db",
}
#: Broker URLs that name a server where nothing listens.
BROKER_UNREACHABLE = {
    "redis": f"redis://:{ENCODED}@127.0.0.1:1/0",
    "sentinel": f"redis+sentinel://:{ENCODED}@127.0.0.1:1/{SERVICE}/0?{RAW_SENTINEL_QUERY}",
    "amqp": f"amqp://u:{ENCODED}@127.0.0.1:1//",
}
ALL = {**{f"raw {k}": v for k, v in RAW.items()}, **STORE_ERRORS}


def assert_hidden(*texts: object) -> None:
    text = "\n".join(map(str, texts))
    assert leaks(text, SECRETS) == [], text


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every log record at DEBUG, scanned when the test ends."""
    with caplog.at_level(logging.DEBUG):
        yield caplog
    assert_hidden(caplog.text, *(repr(record.args) for record in caplog.records))


def test_redact_hides_a_password_with_reserved_characters_in_every_form_written_right_or_not():
    for url in [*ALL.values(), *BROKER_UNREACHABLE.values(), f"sqlite+aiosqlite:///runs.db?password={PASSWORD}"]:
        shown = redact(url)
        assert_hidden(shown)
        assert redact(shown) == shown  # what is shown can be redacted again (a label given redacted)
    assert redact(f"redis://u:{ENCODED}@h:1/0?prefix=p") == "redis://u:***@h:1/0?prefix=p"
    assert redact(f"redis://:{PASSWORD}@h:1/0") == "redis://:***@h:1/0"
    assert redact(f"redis+sentinel://h:1/m?{RAW_SENTINEL_QUERY}&prefix=p") == (
        "redis+sentinel://h:1/m?sentinel_password=***&prefix=p"
    )
    assert redact("sqlite:///a@b.db") == "sqlite:///a@b.db"  # no host part: the @ is the file's


@pytest.mark.parametrize("url", RAW.values(), ids=RAW.keys())
def test_a_user_part_not_percent_encoded_is_refused_saying_how_to_encode_it(url):
    with pytest.raises(ValueError, match="percent-encode") as caught:
        check_user_part(url, "the URL")
    assert_hidden(caught.value)
    assert "%2F" in str(caught.value)


async def store_errors(url: str) -> list[object]:
    """What making a store on `url` in code and reading a run raise, and the store's repr if it is made."""
    errors: list[object] = []
    try:
        if url.startswith(("redis", "redix")):
            store: RedisCheckpointStore | SQLAlchemyCheckpointStore = RedisCheckpointStore.from_url(url)
        else:
            store = SQLAlchemyCheckpointStore(url)
    except ValueError as exc:
        return [exc, repr(exc)]
    errors.append(repr(store))
    try:
        await store.latest("r")
    except Exception as exc:
        errors += [exc, repr(exc)]
    finally:
        await store.aclose()
    return errors


@pytest.mark.parametrize("url", ALL.values(), ids=ALL.keys())
def test_no_store_error_shows_the_password(url, logged, agentflow):
    # Given a store URL that is wrong in some way, with a password of reserved characters
    # When a store is made on it in code and used, and when the command line is given it
    errors = asyncio.run(store_errors(url))
    result = agentflow("runs", "list", env={"AGENTFLOW_STORE": url})
    # Then each fails saying why, and neither the error, its repr, the output nor a log record shows the password
    assert len(errors) > 1 and result.exit_code != 0 and result.output.strip()
    assert_hidden(result.output, *errors)


@pytest.mark.parametrize("url", [*RAW.values(), STORE_ERRORS["bad scheme"]], ids=[*RAW.keys(), "bad scheme"])
def test_no_worker_settings_error_shows_the_password(url, logged, monkeypatch):
    # Given the workers' settings naming that URL as the Redis, the broker or the store
    for name in ("redis_url", "broker_url", "store_url"):
        # When they are read, in code and from the environment as a worker reads them
        with pytest.raises(ValidationError) as caught:
            Settings(app="m:app", checkpoint_keys=KEYS, **{name: url})
        monkeypatch.setenv(f"AGENTFLOW_{name.upper()}", url)
        monkeypatch.setenv("AGENTFLOW_APP", "m:app")
        monkeypatch.setenv("AGENTFLOW_CHECKPOINT_KEYS", KEYS)
        with pytest.raises(SystemExit) as stopped:
            load_settings()
        monkeypatch.delenv(f"AGENTFLOW_{name.upper()}")
        # Then the worker stops with a message naming the setting, and no password
        assert "AGENTFLOW_" in str(stopped.value)
        assert_hidden(caught.value, repr(caught.value), stopped.value)


def test_the_settings_repr_and_a_viewers_label_show_no_password(logged):
    url = STORE_ERRORS["redis unreachable"]
    made = Settings(app="m:app", checkpoint_keys=KEYS, redis_url=url, broker_url=BROKER_UNREACHABLE["amqp"])
    viewer = ViewerSettings(store=MemoryCheckpointStore(), keys=[b"k" * 32], label=url)
    assert viewer.label == "redis://:***@127.0.0.1:1/0"
    assert_hidden(repr(made), str(made), repr(viewer), viewer.label)


@pytest.mark.parametrize("url", RAW.values(), ids=RAW.keys())
def test_a_broker_url_not_percent_encoded_is_refused_before_kombu_reads_it(url, logged):
    with pytest.raises(ValueError, match="percent-encode") as caught:
        celery_config(url)
    assert_hidden(caught.value)
    with pytest.raises(ValueError, match="percent-encode"):
        celery_config(BROKER_UNREACHABLE["amqp"], result_backend=url)


@pytest.mark.parametrize("url", BROKER_UNREACHABLE.values(), ids=BROKER_UNREACHABLE.keys())
def test_no_broker_error_shows_the_password(url, logged):
    # Given a Celery app on a broker where nothing listens, its password percent-encoded
    app = Celery("secrets", set_as_current=False)
    app.conf.update(celery_config(url, key_prefix="secrets"))
    # When it connects
    with app.connection_for_write() as conn, pytest.raises(OperationalError) as caught:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=2)
        # Then it fails, and neither the error, the connection's description nor a log record shows the password
    assert_hidden(caught.value, repr(caught.value), conn.as_uri(), repr(conn), app.conf.humanize(with_defaults=False))


# -- percent-encoded passwords log in -------------------------------------------------


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    """A Redis of our own with `PASSWORD`, and a Sentinel watching it with `SENTINEL_PASSWORD`."""
    binary = server_binary()
    primary = Server(binary, free_port(), tmp_path / "primary", ["--save", ""], password=PASSWORD).start()
    conf = tmp_path / "sentinel" / "sentinel.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 1\n"
        f'sentinel auth-pass {SERVICE} "{PASSWORD}"\n'
        f'requirepass "{SENTINEL_PASSWORD}"\n'
    )
    sentinel = Server(binary, free_port(), conf.parent, [str(conf)], password=SENTINEL_PASSWORD)
    try:
        yield primary, start_sentinel(sentinel)
    finally:
        sentinel.kill()
        primary.kill()


def server_urls(primary: Server, sentinel: Server) -> dict[str, str]:
    return {
        "redis": f"redis://:{ENCODED}@127.0.0.1:{primary.port}/0",
        "sentinel": (
            f"redis+sentinel://:{ENCODED}@127.0.0.1:{sentinel.port}/{SERVICE}/0?sentinel_password={SENTINEL_ENCODED}"
        ),
    }


async def runs_listed(url: str) -> list[str]:
    async with RedisCheckpointStore.from_url(url, prefix=f"t-{uuid.uuid4().hex[:8]}") as store:
        return [cp.run_id for cp in await store.list_runs()]


def test_a_percent_encoded_password_opens_the_store_in_code_and_on_the_command_line(guarded, logged, agentflow):
    # Given a Redis and a Sentinel that need passwords with / # ? @ : + (the Sentinel's + left raw)
    for name, url in server_urls(*guarded).items():
        # When a store is made on the URL in code and by --store
        assert asyncio.run(runs_listed(url)) == [], name
        given = f"{url}{'&' if '?' in url else '?'}prefix=t-{uuid.uuid4().hex[:8]}"
        result = agentflow("runs", "list", env={"AGENTFLOW_STORE": given})
        # Then both log in (no runs yet), and the output shows no password
        assert result.exit_code == 0, result.output
        assert_hidden(result.output)


def test_a_percent_encoded_password_logs_the_broker_and_the_results_in(guarded, logged):
    # Given the same servers as a Celery broker and result backend, plain Redis and through the Sentinel
    primary, _ = guarded
    for name, url in server_urls(*guarded).items():
        prefix = f"b{uuid.uuid4().hex[:8]}"
        app = Celery("secrets", set_as_current=False)
        app.conf.update(celery_config(url, key_prefix=prefix, queue=prefix))
        # When a task is sent and a result stored
        app.send_task("nothing", queue=prefix)
        app.backend.set(f"{prefix}-k", "v")
        # Then the broker holds the message and the backend the result, on the server that needs the password
        with primary.client() as client:
            assert client.llen(f"{prefix}:celery:{prefix}") == 1, name
            assert app.backend.get(f"{prefix}-k") == b"v", name
        app.close()


def test_a_percent_encoded_password_reaches_kombu_and_sqlalchemy_decoded():
    # RabbitMQ's and PostgreSQL's servers are shared (trust, no user of ours): the password they would be sent
    app = Celery("secrets", set_as_current=False)
    app.conf.update(celery_config(BROKER_UNREACHABLE["amqp"]))
    with app.connection_for_write() as conn:
        assert conn.password == PASSWORD
    store = SQLAlchemyCheckpointStore(STORE_ERRORS["postgres unreachable"])
    assert store._db.url.password == PASSWORD
    assert_hidden(repr(store))
