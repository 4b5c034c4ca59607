"""`agentflow.celery.make_app`: a Celery app and tasks from flows, agents and settings (no server needed)."""

from __future__ import annotations

import secrets

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from agentflow import FlowApp, Registry
from agentflow.celery import Settings, make_app
from agentflow.celery.app import NOTHING_TO_RUN
from agentflow.integrations.pydantic_ai import DurableAgent

KEY = "hex:" + secrets.token_hex(32)


@pytest.fixture
def deployment_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deployment's AGENTFLOW_* variables, as a worker's environment holds them (no app named)."""
    for name in ("AGENTFLOW_APP", "AGENTFLOW_BROKER_URL", "AGENTFLOW_STORE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENTFLOW_CHECKPOINT_KEYS", KEY)
    monkeypatch.setenv("AGENTFLOW_REDIS_URL", "redis://127.0.0.1:6399/3")
    monkeypatch.setenv("AGENTFLOW_KEY_PREFIX", "fleet-test")


def durable() -> DurableAgent:
    return DurableAgent(Agent(TestModel(), name="support"))


def test_make_app_serves_the_agents_it_is_given_with_the_environments_settings(deployment_env: None) -> None:
    # When a fleet is made from an agent alone
    app, tasks = make_app(agents={"support": durable()})

    # Then its workers run the agent, agentflow's tasks are on the app, and the settings are the environment's
    assert sorted(tasks.worker.flow_app.loops) == ["support"]
    assert {"agentflow.superstep", "agentflow.loop_stage", "agentflow.recover_all"} <= set(app.tasks)
    assert app.conf.broker_url == "redis://127.0.0.1:6399/3"
    assert app.conf.broker_transport_options["global_keyprefix"].startswith("fleet-test")


def test_make_app_keyword_values_override_the_environment(deployment_env: None) -> None:
    _, tasks = make_app(agents={"support": durable()}, lease_s=5.0, queue="support-q")

    assert tasks.worker.settings.lease_s == 5.0
    assert tasks.worker.settings.queue == "support-q"


def test_make_app_takes_a_flow_app_or_its_parts_not_both(deployment_env: None) -> None:
    flow_app = FlowApp(Registry(), [])

    with pytest.raises(TypeError, match="give a FlowApp or flows, registry and agents, not both"):
        make_app(flow_app, agents={"support": durable()})


def test_make_app_takes_settings_or_single_values_not_both(deployment_env: None) -> None:
    with pytest.raises(TypeError, match=r"give settings or single values \(lease_s\), not both"):
        make_app(agents={"support": durable()}, settings=Settings(), lease_s=5.0)


def test_make_app_with_nothing_to_run_says_what_to_give(deployment_env: None) -> None:
    with pytest.raises(SystemExit) as stopped:
        make_app()

    assert str(stopped.value) == NOTHING_TO_RUN


def test_make_app_without_flows_or_agents_runs_the_app_agentflow_app_names(
    deployment_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTFLOW_APP", "agentflow.demo.tickets:app")

    _, tasks = make_app()

    assert "tickets" in tasks.worker.flow_app.flows


def test_make_app_stops_on_invalid_settings_with_one_message_saying_what_to_fix(
    deployment_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTFLOW_CHECKPOINT_KEYS")

    with pytest.raises(SystemExit, match="^agentflow settings: AGENTFLOW_CHECKPOINT_KEYS is not set"):
        make_app(agents={"support": durable()})


def test_the_package_settings_need_no_app_but_the_repositorys_deployment_does(deployment_env: None) -> None:
    from config import Settings as DeploymentSettings
    from config.settings import APP_NOT_SET

    assert Settings().app == ""
    with pytest.raises(ValueError, match="AGENTFLOW_APP is not set") as refused:
        DeploymentSettings()
    assert APP_NOT_SET in str(refused.value)
