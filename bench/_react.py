"""LangGraph's side of `bench.loop_durability`: its prebuilt ReAct agent over a scripted chat model.

The agent is `langgraph.prebuilt.create_react_agent` (deprecated in langgraph 1.x in favour
of ``langchain.agents.create_agent``, which lives in the ``langchain`` package; the bench
extra installs langgraph only, so the prebuilt one is what the installed langgraph offers).
Its model is `ScriptedChat`: no network, and it picks its reply by how many tool results
the conversation holds, so one model serves every run (each on a thread of its own). The
tool has a sync and an async body, so `invoke` and `ainvoke` both run it without a thread
hop. The replies and the tool's result are the same texts agentflow's side uses.

Also here: what each of LangGraph's savers holds for one thread, in bytes.
"""

from __future__ import annotations

import sqlite3
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, StructuredTool

from agentflow.models import Message
from bench import _langgraph


class ScriptedChat(BaseChatModel):
    """A chat model that answers reply number n once the conversation holds n tool results."""

    replies: list[AIMessage]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self  # the script already knows which tool it calls

    def _reply(self, messages: list[BaseMessage]) -> ChatResult:
        results = sum(1 for m in messages if isinstance(m, ToolMessage))
        # A copy: LangGraph and langchain set ids on the messages they are handed.
        return ChatResult(generations=[ChatGeneration(message=self.replies[results].model_copy())])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._reply(messages)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._reply(messages)


def tool(result: str) -> BaseTool:
    """The ``lookup`` tool, returning `result` (sync and async bodies)."""

    def lookup(query: str) -> str:
        return result

    async def alookup(query: str) -> str:
        return result

    return StructuredTool.from_function(func=lookup, coroutine=alookup, name="lookup", description="Look something up.")


def as_ai(reply: Message) -> AIMessage:
    """agentflow's scripted reply as LangGraph's model returns it."""
    calls = [{"id": c.id, "name": c.name, "args": dict(c.arguments)} for c in reply.tool_calls]
    return AIMessage(content=reply.content or "", tool_calls=calls)


def agent(replies: Sequence[Message], result: str, checkpointer: Any = None) -> Any:
    """The prebuilt ReAct agent over `ScriptedChat` answering `replies`, compiled with `checkpointer`."""
    from langgraph.prebuilt import create_react_agent

    model = ScriptedChat(replies=[as_ai(r) for r in replies])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notice (see the module docstring)
        return create_react_agent(model, [tool(result)], checkpointer=checkpointer)


def inputs(user: Message) -> dict[str, Any]:
    """A run's input: a new `HumanMessage` every time (LangGraph sets its id in place)."""
    return {"messages": [HumanMessage(content=user.content or "")]}


def config(stages: int) -> dict[str, Any]:
    """A config with a new thread id and room for the run's ``2 * stages + 1`` supersteps."""
    return _langgraph.config() | {"recursion_limit": 4 * stages + 10}


def _bytes_in(value: Any) -> int:
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, str):
        return 0  # type tags, ids and channel names: the payloads are bytes
    if isinstance(value, dict):
        return sum(_bytes_in(v) for v in value.values())
    if isinstance(value, tuple | list):
        return sum(_bytes_in(v) for v in value)
    return 0


def memory_bytes(saver: Any, thread_id: str) -> int:
    """Serialized bytes an `InMemorySaver` holds for one thread (checkpoints, metadata, blobs, writes)."""
    held = _bytes_in(saver.storage.get(thread_id, {}))
    held += sum(_bytes_in(v) for k, v in saver.writes.items() if k[0] == thread_id)
    held += sum(_bytes_in(v) for k, v in saver.blobs.items() if k[0] == thread_id)
    return held


def sqlite_bytes(path: Path, thread_id: str) -> int:
    """Bytes a LangGraph SQLite file holds for one thread: checkpoint + metadata, and the writes' values."""
    with sqlite3.connect(path) as conn:
        cps = conn.execute(
            "SELECT coalesce(sum(length(checkpoint) + length(metadata)), 0) FROM checkpoints WHERE thread_id = ?",
            (thread_id,),
        ).fetchone()[0]
        writes = conn.execute(
            "SELECT coalesce(sum(length(value)), 0) FROM writes WHERE thread_id = ?", (thread_id,)
        ).fetchone()[0]
    return int(cps) + int(writes)


async def postgres_bytes(saver: Any, thread_id: str) -> int:
    """Bytes an `AsyncPostgresSaver` holds for one thread: checkpoint + metadata (as JSON text), blobs, writes."""
    total = 0
    for sql in (
        "SELECT coalesce(sum(octet_length(checkpoint::text) + octet_length(metadata::text)), 0) AS n "
        "FROM checkpoints WHERE thread_id = %s",
        "SELECT coalesce(sum(octet_length(blob)), 0) AS n FROM checkpoint_blobs WHERE thread_id = %s",
        "SELECT coalesce(sum(octet_length(blob)), 0) AS n FROM checkpoint_writes WHERE thread_id = %s",
    ):
        cur = await saver.conn.execute(sql, (thread_id,))
        row = await cur.fetchone()
        total += int(row["n"])
    return total
