"""Model adapters for the tool loop: the `Model` protocol, messages, and adapters.

The adapters on the official SDKs are imported on first use: `OpenAIChatModel` needs the
``openai`` extra, `AnthropicModel` the ``anthropic`` extra; without it, the import error
names the extra to install.
"""

import importlib
import typing

from agentflow.models._messages import Message, ToolCall
from agentflow.models._protocol import Model
from agentflow.models.scripted import ScriptedModel

if typing.TYPE_CHECKING:
    from agentflow.models.anthropic import AnthropicModel
    from agentflow.models.openai import OpenAIChatModel

__all__ = ["AnthropicModel", "Message", "Model", "OpenAIChatModel", "ScriptedModel", "ToolCall"]

#: Adapter -> the module that defines it (its import error names the extra).
_ADAPTERS = {"AnthropicModel": "agentflow.models.anthropic", "OpenAIChatModel": "agentflow.models.openai"}


def __getattr__(name: str) -> typing.Any:
    if name in _ADAPTERS:
        return getattr(importlib.import_module(_ADAPTERS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
