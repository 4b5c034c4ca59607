"""The SQLAlchemy store for PostgreSQL and SQLite (``pip install 'agentflow[sqlalchemy]'``): the store in `store`."""

from agentflow.exec.checkpoints.sqlalchemy.store import MIGRATIONS, SQLAlchemyCheckpointStore

__all__ = ["MIGRATIONS", "SQLAlchemyCheckpointStore"]
