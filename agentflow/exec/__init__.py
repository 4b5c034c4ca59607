"""Tools, the executor, the call log and the tool loop (`LoopRunner`; `run_tool_loop` and `recover_tool_loop`)."""

from agentflow.exec._executor import ApprovalRequest, Approver, Executor
from agentflow.exec._loop_engine import LoopResult
from agentflow.exec._loop_functions import recover_tool_loop, run_tool_loop
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
    "current_call",
    "idempotency_key",
    "recover_tool_loop",
    "run_tool_loop",
]
