"""Import of the backends that need an extra, with an error that names the extra."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def load_optional(module: str, name: str, extra: str) -> Any:
    """Import `name` from `module`, or say which extra to install.

    Raises:
        ImportError: the backend's driver is not installed.
    """
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ImportError(f"{name} needs the {extra!r} extra: pip install 'agentflow[{extra}]' ({exc})") from exc


def lazy_attributes(package: str, optional: Mapping[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports each optional name on first use.

    Args:
        package: the package's ``__name__`` (for the error on an unknown name).
        optional: public name -> (module that defines it, extra that installs its driver).
    """

    def attribute(name: str) -> Any:
        if name in optional:
            module, extra = optional[name]
            return load_optional(module, name, extra)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return attribute
