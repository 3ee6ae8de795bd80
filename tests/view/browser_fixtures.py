"""What the viewer's browser tests (test_browser.py) and benchmarks/viewer_screenshots.py share: finding chromium and
Playwright, the fixture runs (a real short `train` run, an environment run with tool calls, an `rm eval` report, and a
copy of the train run with a `<script>` completion injected), starting `rewardlab view` as a subprocess, and
launching headless chromium.

Chromium is Debian's `chromium` package (`apt-get install chromium`), driven through Playwright's Python package
(`pip install playwright`) with `executable_path`; Playwright's own browser download (`playwright install`) is not
used. REWARDLAB_CHROMIUM names another chromium binary.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

#: How to enable the browser tests, in the skip message.
ENABLE = "apt-get install chromium; pip install playwright"
#: Chromium's flags: headless, no sandbox (the tests may run as root), and none of its background connections (the
#: test machines have no network; without these flags chromium's refused connections pile up).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
#: The text of the completion injected into the `xss` run (and of some train prompts): the page must show it as text
#: and never run it (a script element, and an image whose failed load would run code where HTML is parsed).
XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
#: The tiny architecture of tests/conftest.py, as config overrides (the CLI processes do not import conftest).
TINY = ["model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=1", "model.tiny.num_attention_heads=2",
        "model.tiny.intermediate_size=64"]
#: A second reward component of the train run: the share of lowercase letters, which varies between a group's
#: random completions, so the run has advantages of both signs.
LOWER_REWARD = "def lower(completion):\n    return sum(c.islower() for c in completion) / max(1, len(completion))\n"
#: Preference pairs of the rm eval report (exact_match scores them: 3 of 5 right, one tie).
PAIRS = [
    {"prompt": "2+3=", "chosen": "5", "rejected": "6", "row": {"answer": "5"}, "subset": "sums"},
    {"prompt": "4+4=", "chosen": "8", "rejected": "7", "row": {"answer": "8"}, "subset": "sums"},
    {"prompt": "1+1=", "chosen": "2", "rejected": "2", "row": {"answer": "2"}, "subset": "ties"},
    {"prompt": "9+0=", "chosen": "9", "rejected": "<b>x</b>", "row": {"answer": "9"}, "subset": "sums"},
    {"prompt": "3+0=", "chosen": "4", "rejected": "3", "row": {"answer": "3"}, "subset": "flipped"},
]
SRC = Path(__file__).resolve().parents[2] / "src"


def chromium_path() -> str | None:
    """The chromium binary: $REWARDLAB_CHROMIUM, else `chromium` or `chromium-browser` on PATH; None when none."""
    named = os.environ.get("REWARDLAB_CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def missing() -> str | None:
    """Why the browser tests cannot run (what is missing and how to enable them), or None when they can."""
    lacking = []
    if chromium_path() is None:
        lacking.append("chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        lacking.append("playwright")
    if not lacking:
        return None
    return f"browser tests need {' and '.join(lacking)}: {ENABLE}"


def _env() -> dict[str, str]:
    """The environment of the CLI processes: this checkout's rewardlab first, one OpenMP thread."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{path}" if path else str(SRC), "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def cli(*args: str, log: Path) -> None:
    """Run `rewardlab ARGS` in a child process (output to `log`).

    Raises:
        RuntimeError: it exited non-zero (with the log's tail).
    """
    with open(log, "w") as out:
        code = subprocess.run([sys.executable, "-m", "rewardlab.cli", *args], env=_env(), stdout=out,
                              stderr=subprocess.STDOUT, timeout=600).returncode
    if code != 0:
        raise RuntimeError(f"rewardlab {' '.join(args[:2])} exited {code}:\n{log.read_text()[-3000:]}")


def make_train_run(root: Path, name: str = "train", steps: int = 3) -> Path:
    """A real `rewardlab train` run of the tiny model on sums: `steps` steps of 2 prompts x 4 rollouts, rewards chrF
    and `lower` (mixed-sign advantages), two minibatches a step (ratios away from 1 in the second), the first 6
    episodes of each step token-logged (the other 2 have no per-token data). Every fourth prompt starts with a
    `<script>` element."""
    rows = [{"prompt": (XSS if (a + b) % 4 == 0 else "") + f"{a}+{b}=", "answer": str(a + b)}
            for a in range(10) for b in range(3)]
    task = root / f"{name}_task.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reward = root / f"{name}_lower.py"
    reward.write_text(LOWER_REWARD)
    out = root / name
    cli("train", "--no-progress", "--model", "tiny", "--out", str(out), "--task", f"jsonl:{task}",
        "task.options={test_size: 5}", *TINY, "rl.prompts_per_step=2", "rl.group_size=4",
        "rl.sampling.max_new_tokens=6", "rl.lr=1e-2", "rl.minibatch_size=4", f"rl.steps={steps}",
        f"rewards=[{{name: chrf}}, {{name: '{reward}:lower'}}]", "rl.logging.log_tokens=6",
        log=root / f"{name}.log")
    return out


def make_env_run(root: Path, name: str = "calc") -> Path:
    """A real environment run with tool calls: the tiny model taught the calculator's `<c>...</c>` calls by 100 SFT
    steps on tool traces, then 2 GRPO steps of 2 questions x 4 episodes in `env:calculator`, every episode
    token-logged."""
    task = ["--task", "env:calculator", "task.options={size: 200, test_size: 10, max_terms: 2}", "threads=1",
            "env.max_turns=3", "env.max_episode_tokens=72", "env.max_tool_tokens=16"]
    sft = root / f"{name}_sft"
    cli("sft", "--no-progress", "--model", "tiny", *TINY, "--out", str(sft), *task, "sft.steps=100",
        "sft.batch_size=16", "sft.lr=1e-2", "sft.tool_frac=1.0", "sft.eval_every=0", "save_every=1000",
        log=root / f"{name}_sft.log")
    out = root / name
    cli("train", "--no-progress", "--model", str(sft / "checkpoints" / "step-100"), "--out", str(out), *task,
        "rl.steps=2", "rl.prompts_per_step=2", "rl.group_size=4", "rl.sampling.max_new_tokens=24",
        "rl.sampling.temperature=0.5", "rl.lr=2e-4", "rl.logging.log_tokens=all", log=root / f"{name}.log")
    return out


def make_rm_report(root: Path, name: str = "rmeval") -> Path:
    """A real `rewardlab rm eval` report: exact_match on `PAIRS`."""
    data = root / f"{name}_pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    out = root / name
    cli("rm", "eval", "--no-progress", "--data", str(data), "--out", str(out), "scorer=[{name: exact_match}]",
        log=root / f"{name}.log")
    return out


def make_xss_run(train: Path, out: Path) -> Path:
    """A copy of the run `train` (without its checkpoints) whose step-1 rollout 0 has the completion `XSS` and
    `XSS` as its first token's text, written back with rollout_log."""
    from rewardlab import rollout_log

    shutil.copytree(train, out, ignore=shutil.ignore_patterns("checkpoints", ".lock"))
    n = rollout_log.read_step(out, 1, columns=["index"]).num_rows
    records = [rollout_log.read_rollout(out, 1, i) for i in range(n)]
    records[0]["completion"] = XSS
    if records[0].get("tokens"):
        records[0]["tokens"] = [XSS, *records[0]["tokens"][1:]]
    rollout_log.write_parquet(rollout_log.rollouts_table(1, records), rollout_log.rollouts_path(out, 1))
    return out


def make_runs(root: Path) -> dict[str, Path]:
    """The fixture runs under `root`, built two at a time: {"train", "calc", "rmeval", "xss"} -> run directory."""
    root.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(2) as pool:
        env = pool.submit(make_env_run, root)
        train = pool.submit(make_train_run, root)
        rm = pool.submit(make_rm_report, root)
        runs = {"train": train.result(), "calc": env.result(), "rmeval": rm.result()}
    runs["xss"] = make_xss_run(runs["train"], root / "xss")
    return runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def viewer(run_dirs: list[Path], log: Path, timeout_s: float = 60.0):
    """`rewardlab view RUN_DIR... --port P --host 127.0.0.1` as a child process; yields its base URL once
    /api/runs answers, terminates it on exit.

    Raises:
        RuntimeError: it exited, or did not answer within `timeout_s` (with its output's tail).
    """
    port = free_port()
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "rewardlab.cli", "view", *map(str, run_dirs), "--port", str(port),
                             "--host", "127.0.0.1"], env=_env(), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"rewardlab view exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/runs", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"rewardlab view did not answer in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()


@contextmanager
def browser_context(viewport: dict | None = None):
    """A headless chromium (`chromium_path()`) through Playwright, with a fresh profile; yields a Playwright
    BrowserContext."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="rewardlab-chromium-")
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                profile, executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS,
                viewport=viewport or {"width": 1280, "height": 900})
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def read_metrics(run: Path) -> list[dict]:
    """The records of a run's metrics.jsonl, in order."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
