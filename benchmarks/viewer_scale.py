"""How fast `rewardlab view` opens each page on a run with 1 million logged rollouts.

    python benchmarks/viewer_scale.py                       # 1000 steps x 1000 rollouts into /tmp/viewer_scale
    python benchmarks/viewer_scale.py --steps 50 --dir DIR  # smaller, elsewhere

Writes (once; reused when it is there with the same size) a train run whose every step has a rollouts file written
by `rewardlab.rollout_log.write_step`: `--per-step` rollouts with all scalar columns, the first `--logged` of them
with per-token values of `--tokens` tokens, prompt groups of 8 drawn from a pool of `--prompts` prompts (so a prompt
recurs across steps), plus metrics.jsonl, events.jsonl and summary.json. Then it serves the run with uvicorn on
127.0.0.1 and times, with httpx, each page's HTML and every API call its script makes: "cold" on a fresh server
(empty caches; the server starts building the prompt index in the background when it starts, and the pages are
asked for in the table's order right after), "warm" when asked again. Target: each page under 2 s, its API calls
included.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rewardlab.rollout_log import logged_steps, write_step  # noqa: E402
from rewardlab.runs import RunDir  # noqa: E402

WORDS = "the of a to and is sum carry digit step answer total then add so we get".split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _records(step: int, args: argparse.Namespace, rng: random.Random) -> list[dict]:
    """The records of one step: groups of 8 rollouts of prompts drawn from the pool."""
    records = []
    for i in range(args.per_step):
        g = i // 8
        if i % 8 == 0:
            key = rng.randrange(args.prompts)
        reward = float(rng.random() < 0.5)
        rec = {"episode": i, "row": 0, "group": g, "prompt_key": f"q{key}", "prompt": f"question {key}: "
               + _text(random.Random(key), 8), "completion": _text(rng, 20), "answer": str(key),
               "reward": reward, "components": {"correct": reward, "format": float(rng.random() < 0.9)},
               "advantage": rng.uniform(-1, 1), "error": None if rng.random() > 0.01 else "timeout",
               "truncated": rng.random() < 0.05, "kept": rng.random() < 0.8, "termination": "stop",
               "policy_version": step - 1, "staleness": 0, "num_tokens": args.tokens}
        if i < args.logged:
            t = args.tokens
            rec.update(tokens=[rng.choice(WORDS) for _ in range(t)], token_ids=list(range(t)), loss_mask=[1] * t,
                       logprob_old=[-rng.random() for _ in range(t)], logprob=[-rng.random() for _ in range(t)],
                       ratio=[1 + rng.uniform(-.1, .1) for _ in range(t)],
                       advantages=[rng.uniform(-1, 1) for _ in range(t)], entropy=[rng.random() for _ in range(t)],
                       clip=[0] * t)
        records.append(rec)
    return records


def make_fixture(args: argparse.Namespace) -> Path:
    """The fixture run under `args.dir` (written unless one with as many steps is there)."""
    run = Path(args.dir) / "run"
    if run.is_dir() and len(logged_steps(run)) == args.steps and (run / "summary.json").is_file():
        return run
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("model:\n  path: tiny\ntask:\n  spec: reasoning_gym:chain_sum\nrl:\n"
                                     f"  steps: {args.steps}\n", encoding="utf-8")
    rd, rng, t0 = RunDir(run), random.Random(0), time.perf_counter()
    with (run / "metrics.jsonl").open("w", encoding="utf-8") as metrics:
        for step in range(1, args.steps + 1):
            write_step(rd, step, _records(step, args, rng))
            metrics.write(json.dumps({"step": step, "reward/mean": rng.random(), "loss": rng.random(),
                                      **{f"m/{k}": rng.random() for k in range(30)}}) + "\n")
            if step % 100 == 0:
                print(f"  wrote step {step} ({time.perf_counter() - t0:.0f} s)", flush=True)
    (run / "events.jsonl").write_text(json.dumps({"time": 0, "event": "start", "pid": 0}) + "\n", encoding="utf-8")
    (run / "summary.json").write_text(json.dumps({"steps": args.steps}), encoding="utf-8")
    return run


def _serve(run: Path):
    """A uvicorn server of `create_app([run])` in a thread: (server, base URL)."""
    import uvicorn

    from rewardlab.view import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app([run]), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


def pages(run: Path) -> dict[str, list[str]]:
    """Each page: its URL then the API calls (and scripts) its script makes."""
    steps = logged_steps(run)
    mid = steps[len(steps) // 2]
    from rewardlab.rollout_log import read_step

    key = read_step(run, mid, ["prompt_key"])["prompt_key"][0].as_py()
    common = ["/static/common.js", "/static/style.css"]
    return {
        "runs": ["/runs", *common, "/static/runs.js", "/api/runs", "/api/runs/0/steps"],
        "metrics": ["/metrics", *common, "/plotly.min.js", "/static/metrics.js", "/api/runs", "/api/runs/0/metrics"],
        "rollouts of a step": [f"/runs/0/steps/{mid}", *common, "/static/step.js", "/api/runs/0/steps",
                               f"/api/runs/0/steps/{mid}/rollouts?offset=0&limit=100&filter="],
        "  sorted + filtered": [f"/api/runs/0/steps/{mid}/rollouts?offset=0&limit=100&sort=advantage&desc=1"
                                "&filter=kept=true reward>0.5"],
        "  group side by side": [f"/api/runs/0/steps/{mid}/groups/3"],
        "one rollout": [f"/runs/0/steps/{mid}/rollouts/3", *common, "/static/rollout.js", "/api/runs/0/steps",
                        f"/api/runs/0/steps/{mid}/rollouts/3"],
        "prompt across steps": [f"/runs/0/prompts/{key}", *common, "/static/prompt.js", "/api/runs/0/steps",
                                f"/api/runs/0/prompts/{key}?offset=0&limit=20"],
        "reports": ["/runs/0/reports", *common, "/plotly.min.js", "/static/reports.js", "/api/runs/0/steps",
                    "/api/runs/0/reports"],
    }


def measure(run: Path) -> list[tuple[str, float, float]]:
    """(page, cold seconds, warm seconds): the page's requests one after another, as its script makes them."""
    import httpx

    server, base = _serve(run)
    rows = []
    try:
        with httpx.Client(base_url=base, timeout=120) as client:
            for name, urls in pages(run).items():
                times = []
                for _ in range(2):
                    t0 = time.perf_counter()
                    for url in urls:
                        r = client.get(url)
                        if r.status_code != 200:
                            raise SystemExit(f"{url}: HTTP {r.status_code} {r.text[:200]}")
                    times.append(time.perf_counter() - t0)
                rows.append((name, *times))
    finally:
        server.should_exit = True
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp/viewer_scale", help="where the fixture run is written (and reused)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--per-step", type=int, default=1000, help="rollouts per step")
    p.add_argument("--logged", type=int, default=8, help="rollouts per step with per-token values")
    p.add_argument("--tokens", type=int, default=64, help="tokens of a logged rollout")
    p.add_argument("--prompts", type=int, default=2000, help="prompt pool (a prompt recurs across steps)")
    args = p.parse_args()
    t0 = time.perf_counter()
    run = make_fixture(args)
    size = sum(f.stat().st_size for f in (run / "rollouts").iterdir()) / 2**20
    print(f"fixture: {run}: {args.steps} steps x {args.per_step} rollouts = {args.steps * args.per_step:,} logged "
          f"rollouts, {size:.0f} MiB of rollouts files (ready in {time.perf_counter() - t0:.0f} s)")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} before the timing")
    rows = measure(run)
    print(f"{'page (HTML + its API calls)':<30} {'cold s':>8} {'warm s':>8}")
    for name, cold, warm in rows:
        print(f"{name:<30} {cold:8.3f} {warm:8.3f}")
    from rewardlab.view import data

    t0 = time.perf_counter()
    data.PromptIndex().refresh(data.step_files(data.find_runs([run])[0]))
    print(f"prompt index built from scratch (the worst case of a prompt page asked for at the server's start, "
          f"before the background build): {time.perf_counter() - t0:.3f} s")
    worst = max(cold for _, cold, _ in rows)
    print(f"slowest page cold: {worst:.3f} s (target < 2 s): {'ok' if worst < 2 else 'TOO SLOW'}")
    return 0 if worst < 2 else 1


if __name__ == "__main__":
    sys.exit(main())
