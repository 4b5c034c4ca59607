"""Runs whose every stored string is chosen by an attacker, and the CLI run over them.

Imported as ``hostile_kit`` (tests/cli is on ``sys.path``, as for ``runs_kit``). The runs
are signed with a key of this kit's own (not the demo's), so no flag is needed to read them.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from pathlib import Path

from click.testing import CliRunner, Result
from pydantic import BaseModel

from agentflow import Call, Flow, FlowApp, Registry
from agentflow.cli._group import cli
from agentflow.exec.checkpoints import SQLiteCheckpointStore

KEY = secrets.token_bytes(32)
KEY_TEXT = "hex:" + KEY.hex()

#: Sets the terminal's title (OSC 0, ended by BEL).
OSC_TITLE = "\x1b]0;pwned\x07"
#: Clears the screen (CSI 2J).
CLEAR = "\x1b[2J"
#: Every control character but the line break (C0, DEL, C1): none may reach the terminal raw.
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")

registry = Registry()


@registry.tool(name="fe\x1b[7mtch")
async def fetch(text: str) -> str:
    """Return whatever it is given (the attacker's text becomes the stored result)."""
    return text


@registry.tool
async def fail(text: str) -> str:
    """Fail with whatever it is given (the attacker's text becomes the stored error)."""
    raise ValueError(text)


@registry.tool(approval=True)
async def pay(text: str) -> str:
    """Wait for an approval, with the attacker's text as its arguments."""
    return "paid"


class Note(BaseModel):
    text: str
    """The attacker's text, in the state and given to the tool."""
    out: str = ""


def _flow(name: str, node: str, tool: str) -> Flow[Note]:
    return Flow(name, state=Note).node(node, Call(tool, args=lambda s: {"text": s.text}, into="out")).end(node)


#: Its flow, node and tool names carry control characters too.
FETCHING = _flow("fetch\x1b]0;flow\x07ing", "no\x07de", "fe\x1b[7mtch")
FAILING = _flow("failing", "fail", "fail")
PAYING = _flow("paying", "pay", "pay")
app = FlowApp(registry, [FETCHING, FAILING, PAYING])


async def _write(db: Path, runs: list[tuple[Flow[Note], str, str]]) -> None:
    async with SQLiteCheckpointStore(db) as store:
        runner = app.runner(store, KEY)
        for flow, run_id, text in runs:
            await runner.run(flow, Note(text=text), run_id=run_id)


def write_runs(db: Path, runs: list[tuple[Flow[Note], str, str]]) -> str:
    """Run each ``(flow, run_id, text)`` into the SQLite file `db`; return the store URL."""
    asyncio.run(_write(db, runs))
    return f"sqlite:///{db}"


def invoke(url: str, *args: str, color: bool = True, key: str = KEY_TEXT) -> Result:
    """Run ``agentflow`` in-process on the store at `url`, as on a terminal (colours kept) unless `color` is False."""
    env = {"AGENTFLOW_CHECKPOINT_KEYS": key, "AGENTFLOW_STORE": url, "AGENTFLOW_ALLOW_DEMO_KEY": None}
    return CliRunner().invoke(cli, list(args), env=env, color=color, catch_exceptions=False)


#: The escape sequences the CLI's own colours are made of (``click.style``), and no others.
OWN_STYLES = re.compile(r"\x1b\[(?:3[0-7]|1|22|0)m")


def raw_controls(text: str) -> list[str]:
    """The control characters of `text` (but line breaks) outside the CLI's own colour sequences."""
    return RAW_CONTROL.findall(OWN_STYLES.sub("", text))
