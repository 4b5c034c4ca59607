"""The layering contracts of pyproject.toml hold, and each one fails when its rule is broken.

These tests are where the layers are checked (``make check`` and ``make test`` run them; ``make
lint`` does not run `lint-imports` again): they run it on the tree, and break each contract on
purpose in a copy of the packages, to show that it is not vacuous.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
CONTRACTS = {
    c["id"]: c["name"]
    for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
}

#: One forbidden import per contract: (the file it goes in, the import).
VIOLATIONS = {
    "stores": ("agentflow/exec/checkpoints/memory.py", "import agentflow.exec._registry"),
    "exec-below-flow": ("agentflow/exec/context.py", "import agentflow.flow"),
    "seal": ("agentflow/exec/seal.py", "import agentflow._events"),
    "surfaces": ("agentflow/viewer/_pages.py", "import agentflow.cli._text"),
    "transports": ("agentflow/cli/_cmd_operate.py", "import agentflow.exec.driven"),
    "observe": ("agentflow/celery/_stranded.py", "import agentflow.observe"),
    "otel": ("agentflow/exec/run/steps.py", "import opentelemetry.trace"),
    "integrations": ("agentflow/runs.py", "import pydantic_ai"),
    "wheel": ("agentflow/_display.py", "import config"),
    "demo": ("agentflow/celery/client.py", "import agentflow.demo.tickets"),
    "config": ("config/settings.py", "import agentflow.demo.worker"),
    "sim": ("agentflow/celery/worker.py", "import agentflow.sim"),
}


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Run lint-imports on the packages under `root` (it imports them from its working directory)."""
    cmd = [str(LINT_IMPORTS), "--no-logo", "--no-cache"]
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=60, check=False)


def broken(report: str) -> set[str]:
    """The names of the contracts a lint-imports report calls broken."""
    return {name for name in CONTRACTS.values() if re.search(re.escape(name) + r"\s*BROKEN", report)}


def test_every_layering_contract_is_kept():
    result = lint_imports(ROOT)

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in result.stdout


def test_each_contract_has_a_violation_below():
    assert set(VIOLATIONS) == set(CONTRACTS)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what lint-imports reads: the three root packages and pyproject.toml."""
    copy = tmp_path_factory.mktemp("layers")
    for package in ("agentflow", "workers", "config"):
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy(ROOT / "pyproject.toml", copy)
    return copy


@pytest.mark.parametrize("contract", sorted(VIOLATIONS))
def test_a_forbidden_import_breaks_its_contract(pristine: Path, tmp_path: Path, contract: str) -> None:
    # Given a copy of the packages with one forbidden import added
    root = tmp_path / "tree"
    shutil.copytree(pristine, root)
    path, line = VIOLATIONS[contract]
    with (root / path).open("a") as fh:
        fh.write(f"\n{line}  # a deliberate violation\n")

    # When lint-imports checks it
    result = lint_imports(root)

    # Then it fails, naming that contract among the broken ones (an import can break several)
    assert result.returncode != 0, result.stdout
    assert CONTRACTS[contract] in broken(result.stdout), result.stdout


def test_the_viewer_command_is_the_only_cli_module_that_imports_the_viewer(pristine: Path, tmp_path: Path) -> None:
    # Given another CLI module that imports the viewer
    root = tmp_path / "tree"
    shutil.copytree(pristine, root)
    with (root / "agentflow/cli/_show.py").open("a") as fh:
        fh.write("\nimport agentflow.viewer  # a deliberate violation\n")

    # When lint-imports checks it, Then the surfaces contract is broken
    result = lint_imports(root)
    assert broken(result.stdout) == {CONTRACTS["surfaces"]}, result.stdout


@pytest.mark.parametrize("mode", [None, "demo", "test"])
def test_the_settings_have_no_default_key_not_even_the_demos(monkeypatch: pytest.MonkeyPatch, mode: str | None) -> None:
    pytest.importorskip("pydantic_settings")
    from pydantic import ValidationError

    from config import Settings

    # Given no key, in what used to be the demo's and the tests' modes too (a mode no longer exists)
    if mode is None:
        monkeypatch.delenv("AGENTFLOW_MODE", raising=False)
    else:
        monkeypatch.setenv("AGENTFLOW_MODE", mode)

    # When the workers' settings are read, Then they refuse to start without a key
    with pytest.raises(ValidationError, match="AGENTFLOW_CHECKPOINT_KEYS is not set"):
        Settings(checkpoint_keys=None)
