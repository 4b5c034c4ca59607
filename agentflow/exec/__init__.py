"""Tools, the executor, the call log and the tool loop (`LoopRunner`, and one function per operation on it)."""

from agentflow.exec._executor import ApprovalRequest, Approver, Executor
from agentflow.exec._loop_functions import (
    LoopResult,
    advance_tool_loop,
    cancel_tool_loop,
    decide_in_doubt_tool_loop,
    decide_tool_loop,
    recover_tool_loop,
    run_tool_loop,
    wake_tool_loop,
)
from agentflow.exec._loop_runner import LoopRunner
from agentflow.exec._registry import ApprovalPolicy, Registry, RetryPolicy, Tool
from agentflow.exec.context import CallInfo, current_call, idempotency_key

__all__ = [
    "ApprovalPolicy",
    "ApprovalRequest",
    "Approver",
    "CallInfo",
    "Executor",
    "LoopResult",
    "LoopRunner",
    "Registry",
    "RetryPolicy",
    "Tool",
    "advance_tool_loop",
    "cancel_tool_loop",
    "current_call",
    "decide_in_doubt_tool_loop",
    "decide_tool_loop",
    "idempotency_key",
    "recover_tool_loop",
    "run_tool_loop",
    "wake_tool_loop",
]
