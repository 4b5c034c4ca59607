"""Declaring limits: on the registry, with a tool, and the backend named once and made per process."""

from __future__ import annotations

import os

import pytest

from agentflow.exec import Registry
from agentflow.exec.limits import Limit, LocalLimits, RedisLimits, SQLLimits
from agentflow.exec.limits.table import provider_of
from agentflow.models import ScriptedModel


def test_a_tool_names_limits_declared_before_it_or_brings_its_own():
    registry = Registry()
    shared = registry.limit("openai", concurrency=3, per_second=20)

    @registry.tool(limits=["openai", Limit(concurrency=1)])
    async def ask(q: str) -> str:
        return q

    tool = registry.get("ask")
    assert tool.limits == (shared, Limit("ask", concurrency=1))
    assert shared.rate == 20 and shared.interval_s == 1.0
    assert registry.limit("slow", per_minute=10).interval_s == 60.0


def test_a_limit_a_tool_names_must_be_declared_first():
    registry = Registry()
    with pytest.raises(ValueError, match=r"registry.limit\('openai'"):

        @registry.tool(limits=["openai"])
        async def ask(q: str) -> str:
            return q


@pytest.mark.parametrize(
    "options",
    [{}, {"concurrency": 0}, {"rate": 2, "interval_s": 0}, {"concurrency": True}, {"rate": 1, "jitter": 2}],
)
def test_a_limit_that_bounds_nothing_or_makes_no_sense_is_refused(options):
    with pytest.raises(ValueError):
        Limit("x", **options)


def test_a_name_means_one_limit():
    registry = Registry()
    registry.limit("api", concurrency=1)
    with pytest.raises(ValueError, match="already declared"):
        registry.limit("api", concurrency=2)
    with pytest.raises(ValueError, match="not both"):
        registry.limit("other", per_second=1, per_minute=1)


def test_a_model_takes_the_limit_of_its_provider():
    registry = Registry()
    acme = registry.limit("acme", concurrency=1)
    model = ScriptedModel([])
    assert provider_of(model) == "scripted" and registry.limits.of_model(model) == ()
    model.provider = "acme"  # type: ignore[attr-defined]
    assert registry.limits.of_model(model) == (acme,)


def test_the_backend_is_named_once_and_made_lazily_in_each_process(monkeypatch):
    # Given a registry naming a Redis backend by URL (nothing is made yet)
    registry = Registry(limit_backend="redis://127.0.0.1:6379/0#tenant-7")
    ref = registry.limits.backend

    # When this process, then a forked child (another pid), asks for it
    here = ref.get()
    assert ref.get() is here
    monkeypatch.setattr(os, "getpid", lambda: -42)
    child = ref.get()

    # Then each made its own, with the prefix from the URL
    assert isinstance(here, RedisLimits) and isinstance(child, RedisLimits) and child is not here
    assert child.keys(Limit("a b", concurrency=1), "{t}")[0] == "tenant-7:limit:{a%20b/%7Bt%7D}:held"


def test_a_backend_is_local_by_default_or_made_by_a_factory():
    assert isinstance(Registry().limits.backend.get(), LocalLimits)
    made: list[LocalLimits] = []

    def factory() -> LocalLimits:
        made.append(LocalLimits())
        return made[-1]

    registry = Registry(limit_backend=factory)
    assert registry.limits.backend.get() is made[0]
    with pytest.raises(ValueError, match="redis://"):
        Registry(limit_backend="http://example.com")
    sql = Registry(limit_backend="sqlite+aiosqlite:///limits.db#team_").limits.backend.get()
    assert isinstance(sql, SQLLimits) and sql._t == "team_"
    with pytest.raises(TypeError):
        Registry(limit_backend=42)  # type: ignore[arg-type]


def test_the_limits_package_hands_out_its_backends_from_their_own_modules() -> None:
    # (the names it exports are pinned with every package's, in tests/test_public_api.py)
    import agentflow.exec.limits as limits

    assert limits.RedisLimits is RedisLimits
    assert RedisLimits.__module__ == "agentflow.exec.limits.redis"
