"""What an operator does to stored runs, of any kind, here or through the workers (see README.md)."""

from agentflow.operate._in_process import InProcess
from agentflow.operate._operator import Acted, Operator
from agentflow.operate._through_workers import ThroughWorkers

__all__ = ["Acted", "InProcess", "Operator", "ThroughWorkers"]
