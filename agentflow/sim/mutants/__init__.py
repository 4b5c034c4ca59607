"""The mutation kit: planted bugs in the run protocol and the stores' rules, and the hunts that find them.

`_kit` holds the mutants (`MUTANTS`), each a patch applied in this process for a ``with``
block, never to a file; `_hunt` plants one, runs the simulation, and counts the steps until
an invariant broke. ``python -m agentflow.sim.mutants`` (``make sim-mutants``) hunts every
mutant from several seeds and prints the table docs/simulation.md keeps.
"""

from agentflow.sim.mutants._hunt import Hunt, hunt, hunts, table
from agentflow.sim.mutants._kit import MUTANTS, STORES, Mutant, Unplantable

__all__ = ["MUTANTS", "STORES", "Hunt", "Mutant", "Unplantable", "hunt", "hunts", "table"]
