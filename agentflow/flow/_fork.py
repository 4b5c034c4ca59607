"""What a fork of a flow run copies: the source checkpoint's state, patched and validated.

A fork is one verb for every kind of run (`RunProtocol.fork`): the source checkpoint is
read and checked like any other (signature, flow, graph digest), and the kind copies it
into the new run (`FlowDriver.forked`). A flow run's copy is its state, with `patched`
applied and validated against the flow's state model, its frontier and visits, on the
flow version that checkpoint was saved on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from agentflow._errors import FlowError
from agentflow.flow._graph import Flow

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
