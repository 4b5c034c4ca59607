"""Names that moved out of the ``agentflow`` namespace, kept importable from it for one release.

``agentflow/__init__.py`` binds `moved_attribute` as its module ``__getattr__``: Python calls
it only for a name the package does not bind itself, so every current name costs nothing.
A moved name is looked up in its new home, returned, and a `DeprecationWarning` (pointing at
the user's import) says where to import it from.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Final

from agentflow import errors

#: Errors the root never exported: `LimitsUnavailable`, and those added after the errors moved.
_NEVER_AT_THE_ROOT: Final = frozenset({"LimitsUnavailable", "LeaseLost", "RunNotDone"})
#: Each moved name and the module that has it now: every other error (`agentflow.errors.__all__` is
#: the one list of them).
MOVED: Final[dict[str, str]] = {name: "agentflow.errors" for name in errors.__all__ if name not in _NEVER_AT_THE_ROOT}


def moved_attribute(name: str) -> Any:
    """``agentflow.<name>`` for a name that moved: its new home's, with a `DeprecationWarning`.

    Raises:
        AttributeError: `name` is not a name agentflow has or had.
    """
    home = MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'agentflow' has no attribute {name!r}")
    warnings.warn(
        f"agentflow.{name} moved to {home}.{name}: import it from {home} (the old name goes in the next release)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)
