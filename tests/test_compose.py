"""docker-compose.yml, the Dockerfile and .env.example, checked by reading them (Docker cannot run here)."""

from __future__ import annotations

import re
import secrets
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from config.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = re.compile(r"^\$\{[A-Z_][A-Z0-9_]*(:?[-?][^}]*)?\}$")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|KEYS?$|BASIC_AUTH|REQUIREPASS", re.I)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    found = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            found[name.strip()] = value.strip()
    return found


def argv(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return list(command) if isinstance(command, list) else shlex.split(command)


def healthcheck(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL"), test
    return " ".join(test[1:])


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.partition("=")[::2] for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in [str(k), *strings(v)]]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return [str(node)]


def test_compose_has_redis_worker_beat_and_flower(services):
    assert set(services) == {"redis", "worker", "beat", "flower"}
    for name in ("worker", "beat", "flower"):
        assert services[name]["build"] == "."
        assert services[name]["env_file"] == ".env" or services[name]["env_file"] == [".env"]
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_redis_keeps_what_it_acknowledged_and_never_evicts(compose, services):
    redis = services["redis"]
    assert re.fullmatch(r"redis:7([.-].*)?", redis["image"])  # Celery 5.7 needs Redis >= 6.2
    args = argv(redis)
    assert args[0] == "redis-server"
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert flags["--appendonly"] == "yes"
    assert flags["--appendfsync"] == "everysec"
    assert flags["--maxmemory-policy"] == "noeviction"
    # its data is on a named volume, and the port is not published
    volume, _, target = next(v for v in redis["volumes"] if v.endswith(":/data")).partition(":")
    assert volume in compose["volumes"] and target == "/data"
    assert "ports" not in redis
    assert "redis-cli ping" in healthcheck(redis)


def test_worker_runs_the_workers_app_and_is_pinged_by_name(services):
    worker = services["worker"]
    args = argv(worker)
    assert args[:4] == ["celery", "-A", "workers", "worker"]
    assert "-E" in args or "--task-events" in args  # Flower needs the task events
    assert args[args.index("-n") + 1] == "worker@%h"
    check = healthcheck(worker)
    assert "celery -A workers inspect ping -d worker@$$HOSTNAME" in check
    assert worker.get("init") is True


def test_exactly_one_beat_with_its_schedule_on_a_volume(compose, services):
    beat = services["beat"]
    args = argv(beat)
    assert args[:4] == ["celery", "-A", "workers", "beat"]
    schedule = args[args.index("-s") + 1]
    assert schedule == "/var/lib/agentflow/celerybeat-schedule"
    volume, _, target = beat["volumes"][0].partition(":")
    assert volume in compose["volumes"] and target == str(Path(schedule).parent)
    assert beat["deploy"]["replicas"] == 1


def test_flower_is_published_on_the_hosts_loopback_only_with_auth_from_the_environment(services, env_example):
    flower = services["flower"]
    args = argv(flower)
    assert args[:4] == ["celery", "-A", "workers", "flower"]
    assert "--address=0.0.0.0" in args and "--port=5555" in args
    assert not any(a.startswith(("--basic_auth", "--basic-auth")) for a in args)
    assert flower["ports"] == ["127.0.0.1:5555:5555"]
    assert "/healthcheck" in healthcheck(flower)
    assert "FLOWER_BASIC_AUTH" in env_example
    # no other service publishes a port
    assert [name for name, svc in services.items() if svc.get("ports")] == ["flower"]


def test_no_secret_is_written_in_compose(compose, services):
    for name, service in services.items():
        for var, value in environment(service).items():
            if SECRET_NAME.search(var):
                assert REFERENCE.match(value), f"{name}: {var} must come from .env, not be written inline"
            for user_pw in re.findall(r"://([^@/]*)@", value):
                password = user_pw.partition(":")[2]
                assert REFERENCE.match(password), f"{name}: {var} has a password written inline"
        args = argv(service) if "command" in service else []
        for flag, value in zip(args, args[1:], strict=False):
            if SECRET_NAME.search(flag):
                assert REFERENCE.match(value), f"{name}: {flag} must take its value from .env"
    text = " ".join(strings(compose))
    assert not re.search(r"\b(hex|base64):[0-9A-Za-z+/=]{16,}", text), "a checkpoint key is written in compose"


def test_every_agentflow_variable_compose_passes_is_a_setting(services, env_example):
    fields = {f"AGENTFLOW_{name.upper()}" for name in Settings.model_fields}
    passed = {v for svc in services.values() for v in environment(svc) if v.startswith("AGENTFLOW_")}
    passed |= {v for v in env_example if v.startswith("AGENTFLOW_")}  # env_file: .env
    assert passed <= fields, f"not settings: {sorted(passed - fields)}"
    # and .env.example lists every setting
    assert fields <= set(env_example), f"missing from .env.example: {sorted(fields - set(env_example))}"


def test_env_example_holds_placeholders_and_the_defaults(env_example):
    # The secrets are placeholders: the key is refused, the passwords say to change them
    with pytest.raises(ValidationError, match="AGENTFLOW_CHECKPOINT_KEYS"):
        Settings(app=env_example["AGENTFLOW_APP"], checkpoint_keys=env_example["AGENTFLOW_CHECKPOINT_KEYS"])
    assert "change-me" in env_example["REDIS_PASSWORD"]
    assert "change-me" in env_example["FLOWER_BASIC_AUTH"].partition(":")[2]
    # and the other values are Settings' defaults, so the file documents them
    values = {k.removeprefix("AGENTFLOW_").lower(): v for k, v in env_example.items() if k.startswith("AGENTFLOW_")}
    values.pop("checkpoint_keys")
    values.pop("app")  # no default: see the next test
    parsed = Settings(**values, app="my_company.agents:app", checkpoint_keys="hex:" + secrets.token_hex(32))
    for name, field in Settings.model_fields.items():
        if name in values:
            got = getattr(parsed, name)
            got = got.get_secret_value() if hasattr(got, "get_secret_value") else got
            default = field.default.get_secret_value() if hasattr(field.default, "get_secret_value") else field.default
            assert got == default, (name, got, default)


def test_the_app_has_no_default_and_env_example_does_not_name_the_demos(env_example, monkeypatch, tmp_path):
    # Issue 15: the production settings ran the demo's ticket flow unless told otherwise
    monkeypatch.delenv("AGENTFLOW_APP", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env from the working folder
    assert Settings.model_fields["app"].default == ""
    with pytest.raises(ValidationError, match="AGENTFLOW_APP is not set: set it to the FlowApp"):
        Settings(checkpoint_keys="hex:" + secrets.token_hex(32))
    # .env.example's value is a placeholder for the user's module, not the demo's app
    app = env_example["AGENTFLOW_APP"]
    assert re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", app), app
    assert not app.startswith("agentflow."), app
    # and its comment says the value is required and how to try the demo's flow instead
    text = (ROOT / ".env.example").read_text()
    comment = text[: text.index("AGENTFLOW_APP=")].rsplit("\n\n", 1)[-1]
    assert "Required, no default" in comment and "agentflow.demo.tickets:app" in comment


def test_compose_references_only_variables_that_env_example_defines(compose, env_example):
    referenced = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", " ".join(strings(compose))))
    assert referenced <= set(env_example), sorted(referenced - set(env_example))


def test_dockerfile_installs_the_celery_extra_and_the_app(compose):
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"pip install [\"']?\.\[celery\]", text)
    for path in ("agentflow", "workers", "config"):
        assert re.search(rf"^COPY {path} ", text, re.M), path
    assert re.search(r"^USER (?!root)\w+", text, re.M)
    assert not re.search(r"^COPY \.\s", text, re.M)  # not the whole folder: a local .env stays out
