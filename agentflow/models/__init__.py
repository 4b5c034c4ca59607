"""Model adapters for the tool loop: the `Model` protocol, messages, and adapters.

The adapters on the official SDKs are imported on first use: `OpenAIChatModel` needs the
``openai`` extra, `AnthropicModel` the ``anthropic`` extra; without it, the import error
names the extra to install.
"""

import typing

from agentflow import _optional
from agentflow.models._messages import Message, ToolCall
from agentflow.models._protocol import Model
from agentflow.models.scripted import ScriptedModel

if typing.TYPE_CHECKING:
    from agentflow.models.anthropic import AnthropicModel
    from agentflow.models.openai import OpenAIChatModel

__all__ = ["AnthropicModel", "Message", "Model", "OpenAIChatModel", "ScriptedModel", "ToolCall"]

_ADAPTERS = {
    "AnthropicModel": ("agentflow.models.anthropic", "anthropic"),
    "OpenAIChatModel": ("agentflow.models.openai", "openai"),
}

__getattr__ = _optional.lazy_attributes(__name__, _ADAPTERS)
