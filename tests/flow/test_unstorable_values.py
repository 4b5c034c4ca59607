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
from agentflow.errors import AgentflowError, FlowError, UnstorableValue
from agentflow.exec.checkpoints import MemoryCheckpointStore, SQLiteCheckpointStore
from agentflow.exec.seal import canonical

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


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


def _itself() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["me"] = value
    return value


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({"n": 10**5000}, r"n is an integer of more than 4300 digits"),
        ({"t": ["ok", "x\ud800"]}, r"t\[1\] holds a lone surrogate"),
        ({"k\udc00": 1}, r"a key of the value holds a lone surrogate"),
        ({"x": math.nan}, r"x is nan, which JSON has no number for"),
        (_deep(5000), r"nests too deeply to write as JSON, or refers to itself"),
        (_itself(), r"nests deeper than 10000 levels \(or refers to itself\)"),
    ],
    ids=["5000-digits", "surrogate", "surrogate-key", "nan", "deep", "itself"],
)
def test_what_the_canonical_encoding_cannot_keep_is_an_agentflow_error_naming_where(value: Any, said: str) -> None:
    with pytest.raises(UnstorableValue, match=said) as refused:
        canonical(value)
    assert isinstance(refused.value, AgentflowError) and isinstance(refused.value, ValueError)


ARG = Flow("arg", state=Reading).node("e", Call("echo", args=lambda r: {"text": r.what + "\udcff"}, into="text"))
ARG = ARG.end("e")


async def test_a_run_id_or_a_tool_argument_with_a_lone_surrogate_is_an_agentflow_error(runner: FlowRunner) -> None:
    # A run id: refused at start, before any store reads it
    with pytest.raises(UnstorableValue, match=r"run id 'r\\udcff' holds a lone surrogate at 1"):
        await runner.run(ECHO, Reading(), run_id="r\udcff")
    assert runner.checkpoints is not None and list(await runner.checkpoints.list_runs()) == []
    # A tool's arguments: the call is never logged started, and the run fails saying why
    result = await runner.run(ARG, Reading(what="a"), run_id="r5")
    assert result.status == "failed" and "UnstorableValue: text holds a lone surrogate" in (result.error or "")
