"""Tools, the executor, the call log and the tool loop."""
