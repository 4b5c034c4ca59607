"""``python -m agentflow.demo [folder]``: run the crash-and-recovery story."""

import sys
from pathlib import Path

from agentflow.demo.story import main

sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("demo-runs")))
