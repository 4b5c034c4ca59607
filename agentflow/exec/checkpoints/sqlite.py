"""`SQLiteCheckpointStore`: placeholder until the backend lands (being written now)."""
