"""The Redis checkpoint store (``pip install 'agentflow[redis]'``): the store in `store`, its parts beside it."""

from agentflow.exec.checkpoints.redis.store import RedisCheckpointStore

__all__ = ["RedisCheckpointStore"]
