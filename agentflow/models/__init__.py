"""Model adapters for the tool loop: the `Model` protocol, messages, and adapters.

The OpenAI-compatible adapter needs the ``openai`` extra (httpx); it is imported on use.
"""

from typing import TYPE_CHECKING, Any

from agentflow.models._messages import Message, ToolCall
from agentflow.models._protocol import Model
from agentflow.models.scripted import ScriptedModel

if TYPE_CHECKING:
    from agentflow.models.openai import OpenAIChatModel

__all__ = ["Message", "Model", "OpenAIChatModel", "ScriptedModel", "ToolCall"]


def __getattr__(name: str) -> Any:
    if name == "OpenAIChatModel":
        from agentflow.exec.checkpoints._optional import load_optional

        return load_optional("agentflow.models.openai", name, "openai")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
