"""Fixtures of the model adapter tests: the stub endpoint, and each adapter kind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from adapter_kit import KINDS, Kind
from openai_stub import StubServer


@pytest.fixture
def stub() -> Iterator[StubServer]:
    server = StubServer().start()
    yield server
    server.stop()


@pytest.fixture(params=KINDS, ids=lambda kind: kind.name)
def kind(request: pytest.FixtureRequest) -> Kind:
    kind: Kind = request.param
    return kind
