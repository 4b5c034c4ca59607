"""JSON only: what JSON cannot keep is refused with an error naming where it is, never stored otherwise.

pydantic's JSON-mode dump writes NaN and infinities under ``Any`` as ``null``: a run used to
end ``done`` with a state other than its own. Text that is not Unicode (a lone surrogate)
used to escape as a raw ``UnicodeEncodeError``. Both are now refused before anything of the
checkpoint is stored, naming the field (``state.out.x``). Run ids in the markers' reserved
namespace (``agentflow/``) are refused at start.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from _kit.tickets import KEY
from pydantic import BaseModel

from agentflow import Call, Executor, Flow, FlowRunner, Registry
from agentflow.errors import FlowError
from agentflow.exec.checkpoints import MemoryCheckpointStore, SQLiteCheckpointStore

registry = Registry()


@registry.tool(idempotent=True)
async def measure(value: str) -> dict[str, Any]:
    return {"x": {"nan": math.nan, "inf": math.inf}.get(value, 1.0)}


@registry.tool(idempotent=True)
async def echo(text: str) -> str:
    return text + "\ud800"


class Reading(BaseModel):
    what: str = "nan"
    out: dict[str, Any] = {}
    text: str = ""


MEASURE = Flow("measure", state=Reading).node("m", Call("measure", args=lambda r: {"value": r.what}, into="out"))
MEASURE = MEASURE.end("m")
ECHO = Flow("echo", state=Reading).node("e", Call("echo", args=lambda r: {"text": r.what}, into="text")).end("e")


@pytest.fixture(params=["memory", "sqlite"])
def runner(request: pytest.FixtureRequest, tmp_path: Any) -> FlowRunner:
    if request.param == "memory":
        return FlowRunner(Executor(registry), checkpoints=MemoryCheckpointStore())
    return FlowRunner(Executor(registry), checkpoints=SQLiteCheckpointStore(tmp_path / "runs.db"), checkpoint_key=KEY)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
async def test_nan_or_an_infinity_in_a_starting_state_is_refused_naming_the_field(
    runner: FlowRunner, value: float
) -> None:
    with pytest.raises(FlowError, match=r"state\.out\.x is .*which JSON has no number for"):
        await runner.run(MEASURE, Reading(out={"x": value}), run_id="r1")
    assert runner.checkpoints is not None and list(await runner.checkpoints.list_runs()) == []


@pytest.mark.parametrize("what", ["nan", "inf"])
async def test_a_tool_result_with_nan_never_ends_a_run_done_with_null(runner: FlowRunner, what: str) -> None:
    # When the tool returns {"x": nan} into a dict of anything
    with pytest.raises(FlowError, match=r"state\.out\.x is .*which JSON has no number for"):
        await runner.run(MEASURE, Reading(what=what), run_id="r2")
    # Then the run did not end done with a null where the number was
    assert runner.checkpoints is not None
    assert (await runner.checkpoints.latest("r2")).status == "running"


async def test_a_lone_surrogate_in_a_starting_state_is_refused_naming_the_field(runner: FlowRunner) -> None:
    with pytest.raises(ValueError, match=r"state\.text holds a lone surrogate \('\\udc00' at 0\)"):
        await runner.run(ECHO, Reading(text="\udc00"), run_id="r3")
    assert runner.checkpoints is not None and list(await runner.checkpoints.list_runs()) == []


async def test_a_tool_result_with_a_lone_surrogate_is_refused_naming_the_field(runner: FlowRunner) -> None:
    with pytest.raises(
        ValueError, match=r"run 'r4': checkpoint 1 cannot be stored: state\.text holds a lone surrogate"
    ):
        await runner.run(ECHO, Reading(what="ok"), run_id="r4")


@pytest.mark.parametrize("run_id", ["agentflow/cancel/victim", "agentflow/recover_all", "agentflow/"])
async def test_a_run_id_in_the_markers_namespace_is_refused_at_start(runner: FlowRunner, run_id: str) -> None:
    with pytest.raises(ValueError, match="agentflow keeps for its own markers"):
        await runner.run(ECHO, Reading(), run_id=run_id)
    assert runner.checkpoints is not None and list(await runner.checkpoints.list_runs()) == []
