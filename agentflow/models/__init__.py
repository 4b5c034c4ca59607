"""Model adapters for the tool loop: the `Model` protocol, messages, and adapters.

The OpenAI-compatible adapter needs the ``openai`` extra (httpx); it is imported on use.
"""

import typing

from agentflow import _optional
from agentflow.models._messages import Message, ToolCall
from agentflow.models._protocol import Model
from agentflow.models.scripted import ScriptedModel

if typing.TYPE_CHECKING:
    from agentflow.models.openai import OpenAIChatModel

__all__ = ["Message", "Model", "OpenAIChatModel", "ScriptedModel", "ToolCall"]


__getattr__ = _optional.lazy_attributes(__name__, {"OpenAIChatModel": ("agentflow.models.openai", "openai")})
