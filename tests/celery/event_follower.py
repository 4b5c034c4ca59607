"""Follows one run's event stream with `FlowClient.events` and prints ``<cursor> <name>`` per event.

Run by test_event_stream.py as a subprocess with a deployment's environment:
``python event_follower.py <run id> [<cursor>]``.
"""

from __future__ import annotations

import asyncio
import sys


async def main(run_id: str, after: str | None) -> None:
    from agentflow.celery import FlowClient
    from config import Settings
    from workers.build import build

    _, tasks = build(Settings())
    async for event in FlowClient(tasks).events(run_id, after, poll_s=0.05):
        print(event.cursor, event.name or f"PROBLEM {event.problem}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
