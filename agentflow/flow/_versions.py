"""`FlowVersions`: the deployed versions of one flow, and which of them a run continues on.

A run is signed with the version of the flow it started on (``version`` in every
checkpoint body, read with `agentflow._run_types.version_of`; runs saved before versions
existed are on ``DEFAULT_VERSION``). Rules:
- a new run starts on the newest version at hand;
- a stored run continues on its own version only, wherever that version is deployed, and
  its graph digest must still match that version's (no silent change within a version);
- a run whose version is not at hand is left exactly as it is: `VersionNotDeployed` says
  so, and an operator's `migrate` (`agentflow.flow._migrate`) moves it to a version that is.

"Newest" compares versions part by part, numbers as numbers (``"10"`` after ``"9"``,
``"1.10"`` after ``"1.9"``), so the order in which an app lists them does not matter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeAlias, TypeVar

from pydantic import BaseModel

from agentflow._errors import FlowError, VersionNotDeployed
from agentflow.flow._graph import Flow

S = TypeVar("S", bound=BaseModel)


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key for versions: numeric parts compare as numbers, and sort before words."""
    parts = re.findall(r"\d+|[^\d._-]+", version)
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


class FlowVersions(Generic[S]):
    """Every version at hand of one flow (see the module docstring)."""

    def __init__(self, flows: Iterable[Flow[Any]]) -> None:
        """Gather the versions of one flow.

        Raises:
            FlowError: no flow given, two names, or one version given twice.
        """
        self._by_version: dict[str, Flow[Any]] = {}
        for flow in flows:
            if self._by_version and flow.name != self.name:
                raise FlowError(f"flows {self.name!r} and {flow.name!r} are not versions of one flow")
            if flow.version in self._by_version:
                raise FlowError(
                    f"flow {flow.name!r} version {flow.version!r} is given twice; "
                    "give each version of a flow its own version string"
                )
            self._by_version[flow.version] = flow
        if not self._by_version:
            raise FlowError("FlowVersions needs at least one flow")
        ordered = sorted(self._by_version, key=version_key)
        self._ordered = [self._by_version[v] for v in ordered]

    @property
    def name(self) -> str:
        """The flow's name."""
        return next(iter(self._by_version.values())).name

    @property
    def newest(self) -> Flow[S]:
        """The version new runs start on."""
        return self._ordered[-1]

    @property
    def versions(self) -> list[str]:
        """The versions at hand, oldest first."""
        return [f.version for f in self._ordered]

    def __iter__(self) -> Iterator[Flow[Any]]:
        return iter(self._ordered)

    def __contains__(self, version: object) -> bool:
        return version in self._by_version

    def get(self, version: str) -> Flow[Any] | None:
        """The flow of `version`, or None when it is not at hand."""
        return self._by_version.get(version)

    def for_run(self, run_id: str, version: str) -> Flow[Any]:
        """The flow a run saved on `version` continues on.

        Raises:
            VersionNotDeployed: that version is not at hand (the run needs it, or a migration).
        """
        flow = self._by_version.get(version)
        if flow is None:
            raise VersionNotDeployed(run_id, self.name, version, self.versions)
        return flow

    def __repr__(self) -> str:
        return f"<FlowVersions {self.name!r}: {', '.join(self.versions)}>"


#: What the runner's methods take: one flow, or every version at hand of one.
FlowLike: TypeAlias = "Flow[S] | FlowVersions[S]"


def as_versions(flow: FlowLike[S]) -> FlowVersions[S]:
    """`flow` as a set of versions (one flow is a set of one)."""
    if isinstance(flow, FlowVersions):
        return flow
    if isinstance(flow, Flow):
        return FlowVersions([flow])
    raise TypeError(f"expected a Flow or FlowVersions, not {type(flow).__name__}")
