"""rl.ray.address: a run joins an existing two-node Ray cluster (`ray.cluster_utils.Cluster`, standing in for
`ray start --head` and `ray start --address=...`) and logs what engine local logs. In a child process: the session's
local cluster (`ray_cluster`) holds this process's one Ray connection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_OVERRIDES

from rewardlab.config import TrainConfig, load_config
from rewardlab.rl.trainer import train

pytest.importorskip("ray")

#: Two nodes of one CPU each; two rollout workers of one CPU each, so one runs on each node.
CHILD = """
import json, sys
from ray.cluster_utils import Cluster
from rewardlab.config import TrainConfig, load_config
from rewardlab.rl.trainer import train

overrides = json.loads(sys.argv[1])
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
cluster.add_node(num_cpus=1)
cluster.wait_for_nodes()
try:
    train(load_config(TrainConfig, None, [*overrides, f"rl.ray.address={cluster.address}"]), show_progress=False)
finally:
    cluster.shutdown()
"""

RUN = [*TINY_OVERRIDES, "task.spec=reasoning_gym:chain_sum", "task.options={size: 40, test_size: 4, min_terms: 2, "
       "max_terms: 2, min_digits: 1, max_digits: 1, template: compact}", "rl.steps=2", "rl.prompts_per_step=4",
       "rl.group_size=2", "rl.sampling.rollout_chunk=4", "rl.sampling.max_new_tokens=4", "rl.lr=5e-2", "threads=1",
       "seed=5",
]


def _metrics(path):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "ray/"))}
            for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.ray_long
def test_a_run_joins_a_two_node_cluster_by_address_and_logs_what_local_logs(tmp_path):
    (tmp_path / "r.py").write_text("def digits(completion):\n"
                                   "    return sum(c.isdigit() for c in completion) / max(1, len(completion))\n")
    run = [*RUN, f"rewards=[{{name: '{tmp_path / 'r.py'}:digits'}}]"]  # imported by path on every worker too
    train(load_config(TrainConfig, None, [*run, f"out={tmp_path / 'local'}"]), show_progress=False)
    ray_run = [*run, f"out={tmp_path / 'ray'}", "rl.engine=ray", "rl.ray.rollout_workers=2",
               "rl.ray.rollout_worker_cpus=1", "rl.ray.reward_workers=1", "rl.ray.reward_worker_cpus=0"]
    src = str(Path(__file__).resolve().parents[2] / "src")  # this checkout's rewardlab, in the child too
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [src, os.environ.get("PYTHONPATH", "")] if p)}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(ray_run)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    local = _metrics(tmp_path / "local")
    assert len(local) == 2 and local[0]["policy/grad_norm"] > 0  # step 2 samples with published weights
    assert _metrics(tmp_path / "ray") == local

