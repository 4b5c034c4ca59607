"""`fork`: a new run that starts from any checkpoint of an old one (time travel).

The source checkpoint is read and checked like any other (signature, flow, graph digest);
its state is copied, patched and validated against the flow's state model, and the new
run starts from that checkpoint's frontier, on the flow version that checkpoint was saved
on. Nothing of the old run's call log carries over: the new run's calls have the new
run's id in their idempotency keys, so an external system sees them as new requests. The
lineage (source run, step, operator) is signed into the new run's step 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from agentflow._errors import CheckpointNotFound, FlowError
from agentflow._identity import RunContext, identity_body
from agentflow.exec.run.trim import no_checkpoint_text
from agentflow.flow._driver import Cursor, FlowProtocol
from agentflow.flow._graph import Flow
from agentflow.flow._result import RunResult

S = TypeVar("S", bound=BaseModel)

#: A patch of the forked state: fields to replace, or a function of the state.
Patch = Mapping[str, Any] | Callable[[Any], Any]


def patched(flow: Flow[S], state: S, patch: Patch | None) -> S:
    """The source state with `patch` applied, validated against the flow's state model.

    Raises:
        FlowError: the patch names a field the model does not have, the patched state does not fit the
            model, or the patch is not a mapping or a function.
    """
    if patch is None:
        return state
    try:
        if isinstance(patch, Mapping):
            unknown = sorted(str(name) for name in patch if name not in flow.state.model_fields)
            if unknown:
                raise FlowError(
                    f"flow {flow.name!r}: the patch names {', '.join(map(repr, unknown))}, which "
                    f"{flow.state.__name__} does not have (its fields: {', '.join(flow.state.model_fields)}); "
                    "nothing was forked"
                )
            return flow.state.model_validate({**state.model_dump(), **dict(patch)})
        if callable(patch):
            copy = state.model_copy(deep=True)
            changed = patch(copy)  # a function may return the new state, or change the copy in place
            target = copy if changed is None else changed
            fields = dict(target) if isinstance(target, Mapping) else target.model_dump()
            return flow.state.model_validate(fields)
    except ValidationError as exc:
        raise FlowError(f"flow {flow.name!r}: the patched state does not fit {flow.state.__name__}: {exc}") from None
    raise FlowError(f"patch must be a mapping of fields or a function of the state, not {type(patch).__name__}")


async def fork(
    proto: FlowProtocol,
    run_id: str,
    *,
    at_step: int,
    new_run_id: str,
    patch: Patch | None,
    ctx: RunContext | None,
    operator: str | None,
    limit: int | None,
) -> RunResult[Any]:
    """See `FlowRunner.fork`."""
    store, sealer = proto.steps._stores()
    rows = list(await store.history(run_id))
    row = next((r for r in rows if r.step == at_step), None)
    if row is None:
        raise CheckpointNotFound(no_checkpoint_text(run_id, at_step, rows))  # says so if retention trimmed it
    row, body = await proto.driver.read(store, sealer, run_id, row)
    source = proto.driver.cursor(row, body, None)
    flow = source.flow  # the new run starts on the version the source checkpoint was saved on
    state = patched(flow, source.state, patch)
    cur = Cursor(
        new_run_id,
        identity_body(sealer, new_run_id, ctx),
        ctx,
        flow,
        state,
        list(source.frontier),
        dict(source.visits),
        source.superstep,
    )
    lineage = {"run": run_id, "step": at_step, **proto.operator(operator)}
    proto.events.emit("run.forked", new_run_id, flow=flow.name, source=run_id, step=at_step)
    result: RunResult[Any] = await proto.begin(cur, limit, lineage)
    return result
