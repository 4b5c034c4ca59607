"""Which sealer a run over a store uses: the shared key given, or the in-process store's own."""

from __future__ import annotations

from collections.abc import Sequence

from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.seal import Sealer


def sealer_for(store: CheckpointStore | None, key: bytes | Sequence[bytes] | None) -> Sealer | None:
    """The sealer runs over `store` use: from `key`, or the in-process store's own key.

    Raises:
        ValueError: a store shared with other processes and no key.
        TypeError: a key is not bytes.
    """
    if key is not None:
        return Sealer(key)
    if store is None:
        return None
    if store.in_process and store.local_key is not None:
        return Sealer(store.local_key)
    raise ValueError(
        f"{type(store).__name__} is shared with other processes, so it needs checkpoint_key= "
        "(32+ random bytes, the same on every worker) to sign and check what it stores"
    )
