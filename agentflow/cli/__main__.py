"""Entry point of the ``agentflow`` command (also ``python -m agentflow.cli``)."""

from __future__ import annotations

from agentflow.cli._group import cli


def main() -> None:
    """Run the ``agentflow`` command."""
    cli(prog_name="agentflow")


if __name__ == "__main__":
    main()
