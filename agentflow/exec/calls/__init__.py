"""The call log: every tool call logged ``started`` before it runs and ``done`` after (see README.md)."""
