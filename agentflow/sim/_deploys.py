"""Deploys in the simulation: the code a worker runs, and how a redeploy changes it mid-episode.

A `Code` is one deploy of the simulated app: each tool's flags (idempotent, needs an
approval), the names the tool loop's tools go by (a tool renamed or removed), and how many
versions of each flow the client starts are deployed (side by side: the old versions stay,
as docs/versioning.md asks while their runs drain). `_world.make_app` builds the app of a
`Code`.

A deploy is a world event drawn from the episode's generator like any fault (`redeploy`):
- ``deploy-idempotent``: one tool's ``idempotent`` flips (either way);
- ``deploy-approval``: one tool's ``approval`` flips (either way);
- ``deploy-rename``: the tool loop's ``charge`` goes by another name (or back);
- ``deploy-remove``: the tool loop's ``look`` is removed (or comes back);
- ``deploy-version``: a new version of every flow the client starts.

It is rolling: a worker keeps the code it started with until it dies; the workers started
after it (a crashed worker's replacement, the deploy's new worker), the sweep and the
operator run the new code. So a call started under one declaration may be recovered under
another, which is what the ledger's flags at each call's start are for (`_world.Effect`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentflow.sim._simulation import Episode

#: The kinds of deploy (each a fault kind in the report).
KINDS = ("deploy-idempotent", "deploy-approval", "deploy-rename", "deploy-remove", "deploy-version")
#: The tools whose flags a deploy may flip (the tool loop's waiting tool keeps its own).
FLIPPED = ("look", "charge", "mail", "wire")
#: The name the tool loop's ``charge`` goes by once renamed.
RENAMED = "pay"
#: How much likelier a deploy is while a worker is inside a tool (what a deploy can break lies there).
INSIDE = 100


@dataclass(frozen=True)
class Declared:
    """What a tool was declared as in one deploy."""

    idempotent: bool
    approval: bool


@dataclass(frozen=True)
class Code:
    """One deploy of the simulated app (the first is the app as the simulation always ran it)."""

    generation: int = 0
    flags: dict[str, Declared] = field(
        default_factory=lambda: {
            "look": Declared(idempotent=True, approval=False),
            "charge": Declared(idempotent=False, approval=False),
            "mail": Declared(idempotent=False, approval=False),
            "wire": Declared(idempotent=False, approval=True),
            "later": Declared(idempotent=True, approval=False),
        }
    )
    loop_charge: str = "charge"
    """The name the tool loop's charging tool goes by (``charge``, or `RENAMED`)."""
    loop_look: bool = True
    """Whether the tool loop has its looking tool."""
    versions: int = 1
    """The versions of each flow the client starts, deployed side by side (``"1"`` to this)."""


def redeploy(code: Code, kind: str, rng: random.Random, near: str | None = None) -> tuple[Code, str]:
    """The code after a deploy of `kind`, and what changed (for the log).

    A flag flip changes tool `near` when given (the tool a stopped worker was in), else one drawn.
    """
    after = replace(code, generation=code.generation + 1)
    if kind in ("deploy-idempotent", "deploy-approval"):
        drawn = rng.choice(FLIPPED)
        tool = near if near in FLIPPED else drawn
        old = code.flags[tool]
        new = (
            replace(old, idempotent=not old.idempotent)
            if kind == "deploy-idempotent"
            else replace(old, approval=not old.approval)
        )
        flag = "idempotent" if kind == "deploy-idempotent" else "approval"
        return replace(after, flags={**code.flags, tool: new}), f"{tool} {flag} {getattr(new, flag)}"
    if kind == "deploy-rename":
        name = "charge" if code.loop_charge == RENAMED else RENAMED
        return replace(after, loop_charge=name), f"loop charge named {name}"
    if kind == "deploy-remove":
        return replace(after, loop_look=not code.loop_look), f"loop look {'back' if not code.loop_look else 'removed'}"
    if kind == "deploy-version":
        return replace(after, versions=code.versions + 1), "a new flow version"
    raise ValueError(f"no deploy of kind {kind!r}; kinds: {', '.join(KINDS)}")


#: Every change a deploy can make, as `redeploy` names it (the report's coverage of deploys).
CHANGES = (
    *(f"{tool} {flag} {value}" for tool in FLIPPED for flag in ("idempotent", "approval") for value in (True, False)),
    f"loop charge named {RENAMED}",
    "loop charge named charge",
    "loop look removed",
    "loop look back",
    "a new flow version",
)


def first_code(rng: random.Random | None) -> Code:
    """The code an episode starts on: the default, or (half the episodes with deploys) one deployed earlier.

    An earlier deploy may have flipped any tool's flags (each flag one time in four), so that
    a flip within the episode goes either way: a tool declared idempotent in the past becomes
    not idempotent, and the reverse. `rng` None (deploys off): the default, nothing drawn.
    """
    code = Code()
    if rng is None or rng.random() < 0.5:
        return code
    flags = dict(code.flags)
    for tool in FLIPPED:
        idempotent, approval = rng.random() < 0.25, rng.random() < 0.25
        old = flags[tool]
        flags[tool] = Declared(old.idempotent != idempotent, old.approval != approval)
    return replace(code, flags=flags)


def maybe_deploy(ep: Episode) -> None:
    """Now and then (not in the drain) the code is redeployed: a rolling deploy replaces one worker.

    A deploy is `INSIDE` times likelier while a worker is inside a tool, and then stops that
    worker: a call in doubt across a deploy is what deploys put at risk.

    Deploys draw from a generator of their own, seeded by the episode's seed (`Episode.deploy_rng`):
    an episode replays exactly from its seed, and one without deploys keeps the schedule it had
    before deploys were simulated (the regression seeds found then). The kind is drawn whether
    or not the deploy applies (a suppressed one keeps the draws in place).
    """
    if ep.draining or not ep.faults.deploy:
        return
    parked = sorted((p.actor, p.point) for p in ep.sched.runnable() if p.actor.startswith("worker"))
    inside = [(actor, point) for actor, point in parked if point.startswith("tool.")]
    rng = ep.deploy_rng
    if rng.random() >= ep.faults.deploy * (INSIDE if inside else 1):
        return
    # The deploy stops one worker of the old code where it is (a rolling deploy's kill, mid-call
    # or not) and starts one on the new code; the others keep their code until they die. A flag
    # flip changes the tool that worker was in, if it was in one: the worst moment for it.
    kind, again, pick = rng.choice(KINDS), rng.random() < 0.5, rng.random()
    among = inside or parked
    victim, point = among[int(pick * len(among))] if among else (None, "between-steps")
    near = point.split(".")[1] if point.startswith("tool.") else None
    code, what = redeploy(ep.code, kind, random.Random(rng.random()), near)
    if not ep.fires(kind, what, victim):
        return
    from agentflow.sim._world import make_app  # the world's app; the world imports this module's `Code`

    ep.code, ep.app = code, make_app(ep.world, code)
    ep.sched.note(f"deploy {code.generation}: {what}")
    if victim is not None:
        ep.sched.note(f"deploy {code.generation}: {victim} stopped at {point}")
        ep.kill(victim, again)
    else:
        ep.workers += 1
        ep.spawn(f"worker{ep.workers}", ep.worker_actor)
