"""Memory is set by rl.micro_batch_size, not by the rollout batch: doubling the rollouts of an update at a fixed
micro-batch raises the peak memory by less than one micro-batch's activations (measured in a fresh process by
`memory_probe.py`, whose unsplit updates measure what the activations of more rollouts take). Linux only (the
kernel's resettable high-water mark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("memory_probe.py")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's resettable VmHWM")
def test_doubling_the_rollouts_at_a_fixed_micro_batch_adds_less_than_one_micro_batch():
    n, micro = 16, 4
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", PYTHONWARNINGS="ignore")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, str(PROBE), str(n), str(micro)], capture_output=True, text=True, env=env,
                         timeout=600, check=True)
    peak = json.loads(out.stdout.strip().splitlines()[-1])  # MiB, the peak RSS during each update
    # without micro-batches, n more rollouts take their activations: per `micro` of them, this much (MiB)
    one_micro_batch = (peak["whole_2n"] - peak["whole_n"]) * micro / n
    assert one_micro_batch > 8, peak  # the probe sees activations at all (16,000-token vocabulary, 56 tokens a row)
    assert peak["micro_2n"] - peak["micro_n"] < one_micro_batch, peak
