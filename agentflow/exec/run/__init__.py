"""The run protocol and what reads and steers a run: one sequence for flows and tool loops (see README.md)."""
