"""A deterministic simulation of the run protocol: real runners, workers and stores, a seeded schedule.

See README.md beside this file for the model, the invariants and the faults, and
docs/simulation.md for running it (``make sim``) and running it against a store of your own.
"""

from agentflow.sim._broker import MessageFaults
from agentflow.sim._report import describe
from agentflow.sim._setups import SETUPS, SetUp, Storage, custom
from agentflow.sim._simulation import Config, Failure, Faults, Report, run_simulation

__all__ = [
    "SETUPS",
    "Config",
    "Failure",
    "Faults",
    "MessageFaults",
    "Report",
    "SetUp",
    "Storage",
    "custom",
    "describe",
    "run_simulation",
]
