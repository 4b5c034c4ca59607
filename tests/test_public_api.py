"""The public API that DESIGN.md promises: its import list, the error tree, and what each package exports."""

import importlib
import inspect
import json

import pytest

import agentflow
import agentflow.errors
import agentflow.exec
import agentflow.exec.checkpoints
import agentflow.exec.limits
import agentflow.flow
from agentflow import _errors
from agentflow._errors import AgentflowError

DESIGN_TOP_LEVEL = ["Flow", "Call", "Registry", "Executor", "FlowRunner", "RunContext"]
DESIGN_CHECKPOINTS = [
    "CheckpointStore",
    "MemoryCheckpointStore",
    "SQLiteCheckpointStore",
    "RedisCheckpointStore",
    "SQLAlchemyCheckpointStore",
    "CheckpointNotFound",
    "CheckpointConflict",
    "CheckpointStoreCorrupt",
    "RecoveryNeedsDecision",
    "idempotency_key",
]


def test_design_top_level_imports():
    from agentflow import Call, Executor, Flow, FlowRunner, Registry, RunContext

    assert [obj.__name__ for obj in (Flow, Call, Registry, Executor, FlowRunner, RunContext)] == DESIGN_TOP_LEVEL
    assert all(inspect.isclass(obj) for obj in (Flow, Call, Registry, Executor, FlowRunner, RunContext))


def test_design_flow_error_import():
    from agentflow.flow import FlowError

    assert FlowError is _errors.FlowError


def test_design_checkpoints_imports():
    from agentflow.exec.checkpoints import (
        CheckpointConflict,
        CheckpointNotFound,
        CheckpointStore,
        CheckpointStoreCorrupt,
        MemoryCheckpointStore,
        RecoveryNeedsDecision,
        RedisCheckpointStore,
        SQLAlchemyCheckpointStore,
        SQLiteCheckpointStore,
        idempotency_key,
    )

    stores = [MemoryCheckpointStore, SQLiteCheckpointStore, RedisCheckpointStore, SQLAlchemyCheckpointStore]
    assert [s.__name__ for s in stores] == DESIGN_CHECKPOINTS[1:5]
    assert all(inspect.isclass(s) for s in stores)
    assert getattr(CheckpointStore, "_is_protocol", False)
    assert (CheckpointNotFound, CheckpointConflict, CheckpointStoreCorrupt, RecoveryNeedsDecision) == (
        _errors.CheckpointNotFound,
        _errors.CheckpointConflict,
        _errors.CheckpointStoreCorrupt,
        _errors.RecoveryNeedsDecision,
    )
    assert idempotency_key is agentflow.exec.idempotency_key


def test_design_tool_loop_imports():
    from agentflow.exec import recover_tool_loop, run_tool_loop

    assert inspect.iscoroutinefunction(run_tool_loop)
    assert inspect.iscoroutinefunction(recover_tool_loop)


@pytest.mark.parametrize("name", ["RedisCheckpointStore", "SQLAlchemyCheckpointStore"])
def test_optional_backends_resolve_lazily_to_their_modules_class(name: str) -> None:
    # Given the lazy names, which the package does not import up front
    backend = {"RedisCheckpointStore": "redis", "SQLAlchemyCheckpointStore": "sqlalchemy"}[name]

    # When one is looked up on the package
    resolved = getattr(agentflow.exec.checkpoints, name)

    # Then it is the class defined in its backend module
    module = importlib.import_module(f"agentflow.exec.checkpoints.{backend}")
    assert resolved is getattr(module, name)


def test_an_unknown_checkpoints_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="NoSuchStore"):
        agentflow.exec.checkpoints.NoSuchStore  # noqa: B018


# --- what each package exports ----------------------------------------------------------

#: Every package's public names, pinned: a name added to or dropped from an ``__all__`` is an
#: API change, made here on purpose. Left out on purpose (importable from their private modules
#: by the workers and the CLI): the Celery worker's internals (``Worker``,
#: ``LoopBridge``, ``Outcome``) and the run read model (``agentflow.exec.run.read``, ``run.view``).
PUBLIC: dict[str, list[str]] = {
    "agentflow": [
        "Call", "Child", "DidNotHappen", "Event", "Events", "Executor", "Flow", "FlowApp", "FlowRunner",
        "FlowVersions", "Happened", "InDoubtDecision", "Limit", "LoopSpec", "Map", "Registry", "Rerun", "RunContext",
        "RunKind", "RunResult", "RunStatus", "Wait",
    ],
    "agentflow.errors": [
        "AgentflowError", "ApprovalDenied", "CheckpointConflict", "CheckpointError", "CheckpointNotFound",
        "CheckpointStoreCorrupt", "CheckpointTooLarge", "ControlRefused", "FlowError", "IdentityMismatch", "LeaseLost",
        "LimitsUnavailable", "ModelError", "RateLimited", "RecoveryNeedsDecision", "RunFailed", "RunHeld", "RunNotDone",
        "Stale",
        "StoreNotDurable", "StoreRefused", "ToolArgumentsInvalid", "ToolError", "ToolTimeout", "UnknownTool",
        "UnstorableValue",
        "VersionNotDeployed",
    ],
    "agentflow.exec": [
        "ApprovalPolicy", "ApprovalRequest", "Approver", "CallInfo", "Executor", "LoopResult", "LoopRunner", "Registry",
        "RetryPolicy", "Tool", "current_call", "idempotency_key", "recover_tool_loop", "run_tool_loop",
    ],
    "agentflow.exec.limits": [
        "BackendSpec", "Limit", "LimitBackend", "LimitKey", "LocalLimits", "RedisLimits", "Refusal", "SQLLimits",
    ],
    "agentflow.exec.checkpoints": [
        "CheckpointConflict", "CheckpointNotFound", "CheckpointStore", "CheckpointStoreCorrupt", "ForwardingStore",
        "MemoryCheckpointStore", "Pruned", "RecoveryNeedsDecision", "RedisCheckpointStore", "RetentionPolicy",
        "RetentionStore", "SQLAlchemyCheckpointStore", "SQLiteCheckpointStore", "SealedCall", "SealedCheckpoint",
        "StoreDefaults", "TrimStore", "Trimmed", "idempotency_key", "prune_finished", "trim_finished",
    ],
    "agentflow.flow": [
        "Call", "Child", "Flow", "FlowError", "FlowRunner", "FlowVersions", "Map", "NodeHandle", "RunResult",
        "RunStatus",
        "Wait",
    ],
    "agentflow.models": ["AnthropicModel", "Message", "Model", "OpenAIChatModel", "ScriptedModel", "ToolCall"],
    "agentflow.celery": [
        "AgentflowTasks", "Fleet", "FlowClient", "RunView", "Settings", "WorkerSettings", "celery_config",
        "load_settings", "load_tasks", "make_app", "register_tasks",
    ],
    "agentflow.viewer": ["ViewerSettings", "create_app", "serve"],
    "agentflow.integrations.pydantic_ai": ["AgentInput", "AgentResult", "AgentRunner", "DurableAgent"],
    "agentflow.observe": [
        "Metrics", "MetricsServer", "Tracing", "serve_metrics", "trace_worker",
    ],
}  # fmt: skip
#: Packages with no public names of their own (a command and a demo).
NO_API = ["agentflow.cli", "agentflow.demo", "agentflow.integrations"]


def public_names(module: object) -> set[str]:
    """Names a module binds that a user could import: not private, not submodules."""
    return {name for name, value in vars(module).items() if not name.startswith("_") and not inspect.ismodule(value)}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_package_exports_exactly_its_pinned_names(name: str) -> None:
    module = importlib.import_module(name)

    assert sorted(module.__all__) == sorted(PUBLIC[name])
    assert len(module.__all__) == len(set(module.__all__))


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_a_package_binds_no_public_name_outside_its_all(name: str) -> None:
    # (lazily resolved names, such as the optional stores, are bound only once looked up)
    module = importlib.import_module(name)

    assert public_names(module) <= set(module.__all__)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_name_in_all_resolves(name: str) -> None:
    module = importlib.import_module(name)

    missing = [attr for attr in module.__all__ if not hasattr(module, attr)]
    assert missing == []


@pytest.mark.parametrize("name", NO_API)
def test_command_and_demo_packages_export_nothing(name: str) -> None:
    module = importlib.import_module(name)

    assert not hasattr(module, "__all__")
    assert public_names(module) == set()


def test_agentflow_all_contains_the_design_names_and_the_errors_module_every_error():
    assert set(DESIGN_TOP_LEVEL) <= set(agentflow.__all__)
    assert agentflow.errors.AgentflowError is AgentflowError
    assert set(ERRORS) == set(agentflow.errors.__all__)


#: The errors a package other than `agentflow.errors` exports: DESIGN.md's imports, and only those.
DESIGN_ERRORS = {
    "agentflow.exec.checkpoints": {
        "CheckpointNotFound", "CheckpointConflict", "CheckpointStoreCorrupt", "RecoveryNeedsDecision",
    },
    "agentflow.flow": {"FlowError"},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(set(PUBLIC) - {"agentflow.errors"}))
def test_an_error_has_one_public_home_besides_the_imports_design_names(name: str) -> None:
    # Given a package other than agentflow.errors
    module = importlib.import_module(name)
    # Then the errors in its __all__ are exactly those DESIGN.md imports from it, each the one of agentflow.errors
    exported = {attr for attr in module.__all__ if inspect.isclass(obj := getattr(module, attr))
                and issubclass(obj, BaseException)}  # fmt: skip
    assert exported == DESIGN_ERRORS.get(name, set())
    assert all(getattr(module, attr) is getattr(agentflow.errors, attr) for attr in exported)


@pytest.mark.parametrize("name", ["AgentflowError", "FlowError", "RunHeld", "CheckpointConflict"])
def test_an_error_is_not_importable_from_the_root(name: str) -> None:
    # (the old names at the root, kept one release with a DeprecationWarning, are gone: agentflow.errors has them)
    with pytest.raises(AttributeError, match=f"module 'agentflow' has no attribute '{name}'"):
        getattr(agentflow, name)


def test_run_kind_and_status_are_the_base_types_everywhere():
    from agentflow._run_types import RunKind, RunStatus

    assert agentflow.RunKind is RunKind
    assert agentflow.RunStatus is RunStatus is agentflow.flow.RunStatus


def test_checkpoints_all_contains_the_design_names():
    assert set(DESIGN_CHECKPOINTS) <= set(agentflow.exec.checkpoints.__all__)


def test_flow_all_contains_flow_error():
    assert "FlowError" in agentflow.flow.__all__


# --- the error tree ---------------------------------------------------------------------

#: The tree STYLE.md and DESIGN.md require (more errors may hang under it).
REQUIRED_TREE = {
    "CheckpointError": "AgentflowError",
    "CheckpointNotFound": "CheckpointError",
    "CheckpointConflict": "CheckpointError",
    "CheckpointStoreCorrupt": "CheckpointError",
    "RecoveryNeedsDecision": "AgentflowError",
    "IdentityMismatch": "AgentflowError",
    "FlowError": "AgentflowError",
}


def drawn_tree(doc: str) -> dict[str, str]:
    """Parse the tree drawn in `agentflow._errors`' docstring into {error: parent}."""
    parents: dict[str, str] = {}
    stack: list[str] = []
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped == "AgentflowError":
            stack = ["AgentflowError"]
            continue
        if not stack or not ("├── " in line or "└── " in line):
            continue
        depth = max(line.find("├── "), line.find("└── ")) // 4
        name = line.split("── ", 1)[1].split()[0]
        del stack[depth + 1 :]
        parents[name] = stack[depth]
        stack.append(name)
    return parents


DRAWN = drawn_tree(_errors.__doc__ or "")
ERRORS = {
    name: value
    for name, value in vars(_errors).items()
    if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == _errors.__name__
}


def test_the_docstring_draws_the_error_tree():
    assert len(DRAWN) >= len(REQUIRED_TREE)


@pytest.mark.parametrize(("name", "parent"), REQUIRED_TREE.items(), ids=list(REQUIRED_TREE))
def test_the_required_error_tree(name: str, parent: str) -> None:
    error = getattr(_errors, name)

    assert issubclass(error, getattr(_errors, parent))
    assert DRAWN[name] == parent


@pytest.mark.parametrize("name", sorted(set(ERRORS) - {"AgentflowError"}))
def test_every_error_subclasses_agentflow_error_where_the_tree_draws_it(name: str) -> None:
    error = ERRORS[name]

    assert issubclass(error, AgentflowError)
    assert name in DRAWN, f"{name} is missing from the tree in agentflow/_errors.py's docstring"
    assert issubclass(error, ERRORS[DRAWN[name]])


def test_the_drawn_tree_names_only_real_errors():
    assert set(DRAWN) <= set(ERRORS)


def test_the_root_limit_is_the_limits_one():
    assert agentflow.Limit is agentflow.exec.limits.Limit


def test_identity_mismatch_is_a_permission_error():
    assert issubclass(_errors.IdentityMismatch, PermissionError)
    with pytest.raises(PermissionError):
        raise _errors.IdentityMismatch("run 'r' belongs to another user")


def test_tool_errors_are_also_the_matching_builtin_errors():
    assert issubclass(_errors.UnknownTool, LookupError)
    assert issubclass(_errors.ToolArgumentsInvalid, ValueError)
    assert issubclass(_errors.ToolTimeout, TimeoutError)


def test_recovery_needs_decision_carries_its_calls_as_pairs():
    exc = _errors.RecoveryNeedsDecision("order-7", [["email_tickets", "started, no result"], ("charge_card", "x")])

    assert exc.calls == [("email_tickets", "started, no result"), ("charge_card", "x")]
    assert exc.run_id == "order-7"
    assert "email_tickets: started, no result" in str(exc)
    assert "decide_in_doubt (Rerun, Happened(result) or DidNotHappen(reason)" in str(exc)
    assert "rerun_in_doubt" not in str(exc)  # it names nothing that would run the tool where it is read


SAMPLE_ARGS: dict[str, tuple[object, ...]] = {
    "RecoveryNeedsDecision": ("order-7", [("email_tickets", "call 0/send/0/ab was started and has no result")]),
    "RunHeld": ("order-7", "w1@host:4242", 1_800_000_000.0),
    "VersionNotDeployed": ("order-7", "tickets", "1", ["2", "3"]),
    "NotDue": ("order-7", 1_800_000_000.0),
    "RunFailed": ("order-7", "ValueError: could not convert string to float: 'broken'"),
    "RunNotDone": ("order-7", "running", "waiting for a decision on calls in doubt: charge_card (not idempotent)"),
}


def sample(error: type[BaseException]) -> BaseException:
    if error.__name__ in SAMPLE_ARGS:
        return error(*SAMPLE_ARGS[error.__name__])
    own_init = [c for c in error.__mro__ if c.__module__.startswith("agentflow") and "__init__" in vars(c)]
    assert not own_init, f"{error.__qualname__} has its own __init__: add sample arguments for it to SAMPLE_ARGS"
    return error(f"{error.__name__} happened: run 'order-7'")


def round_trips(original: BaseException) -> BaseException:
    """Rebuild an error as a Celery result backend does: its type, and its args carried as JSON."""
    return type(original)(*json.loads(json.dumps(original.args)))


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_each_error_round_trips_through_its_args(name: str) -> None:
    # Given an error of each kind
    original = sample(ERRORS[name])

    # When it is rebuilt from its JSON-carried args
    rebuilt = round_trips(original)

    # Then it is the same error, saying the same thing
    assert type(rebuilt) is type(original)
    assert str(rebuilt) == str(original)
    assert rebuilt.args == original.args or json.dumps(rebuilt.args) == json.dumps(original.args)


def test_recovery_needs_decision_keeps_its_calls_through_a_round_trip():
    original = _errors.RecoveryNeedsDecision("order-7", [("email_tickets", "started, no result")])

    rebuilt = round_trips(original)

    assert isinstance(rebuilt, _errors.RecoveryNeedsDecision)
    assert rebuilt.calls == original.calls
    assert rebuilt.run_id == "order-7"


def all_agentflow_errors() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    todo: list[type[BaseException]] = [AgentflowError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_agentflow_error_anywhere_round_trips():
    # Given every subclass of AgentflowError defined once the packages are imported (internal ones too)
    errors = all_agentflow_errors()
    assert len(errors) >= len(ERRORS)

    # Then each rebuilds from its JSON-able args with the same message
    for error in errors:
        original = sample(error)
        assert str(round_trips(original)) == str(original), error.__qualname__
