"""The adapters are imported on first use, and name their extra when its SDK is missing."""

from __future__ import annotations

import importlib
import sys

import pytest

import agentflow.models


@pytest.mark.parametrize(
    ("name", "module", "sdk"),
    [
        ("OpenAIChatModel", "agentflow.models.openai", "openai"),
        ("AnthropicModel", "agentflow.models.anthropic", "anthropic"),
    ],
)
def test_a_missing_sdk_names_the_extra(monkeypatch, name, module, sdk):
    # Given the SDK is not installed (None in sys.modules makes its import fail), the adapter not yet imported
    monkeypatch.setitem(sys.modules, sdk, None)
    monkeypatch.delitem(sys.modules, module, raising=False)

    # When the adapter is looked up on the package, or its module imported, Then the error names the extra
    for load in (lambda: getattr(agentflow.models, name), lambda: importlib.import_module(module)):
        with pytest.raises(ImportError, match=rf"{name} needs the '{sdk}' extra: pip install 'agentflow\[{sdk}\]'"):
            load()


def test_the_adapters_resolve_to_their_modules_classes():
    from agentflow.models.anthropic import AnthropicModel
    from agentflow.models.openai import OpenAIChatModel

    assert agentflow.models.OpenAIChatModel is OpenAIChatModel
    assert agentflow.models.AnthropicModel is AnthropicModel
    with pytest.raises(AttributeError, match="NoSuchModel"):
        agentflow.models.NoSuchModel  # noqa: B018
