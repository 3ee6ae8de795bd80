"""The README's screenshots of `rewardlab view`: its metrics page and the rollout page of a logged rollout.

    python benchmarks/viewer_screenshots.py runs/quickstart [RUN_DIR ...] [--out docs/img] [--metric reward/mean]
                                                                    [--smoothing S]

Starts `rewardlab view RUN_DIR...` (which also lists the runs inside a run: a quickstart's stages) on a free port and
drives headless chromium (Debian's `chromium` through Playwright, as the browser tests do:
`apt-get install chromium; pip install playwright`). It saves
  OUT/viewer_metrics.png  the metrics page of every run that logs METRIC (at the page's smoothing, or --smoothing);
  OUT/viewer_rollout.png  the rollout page (tokens coloured by advantage) of a token-logged rollout of the latest
                          step that has one of a group with advantages of both signs: the one whose per-token
                          advantages have both signs, else the one with the largest |advantage| (else any
                          token-logged rollout).
A run without rollouts files (made before rl.logging existed, or with rl.logging.log_completions false) gets the
metrics screenshot only; when no run has a token-logged rollout the script says so and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "view"))
sys.path.insert(0, str(ROOT / "src"))

import browser_fixtures as bf  # noqa: E402


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())


def _score(rec: dict, group_mixed: bool) -> tuple[int, float]:
    """How good a rollout is for the screenshot: mixed-sign per-token advantages first, then a group of both signs,
    then the size of its advantage."""
    advs = [a for a, m in zip(rec["advantages"] or [], rec["loss_mask"] or []) if m == 1 and a]
    mixed = any(a > 0 for a in advs) and any(a < 0 for a in advs)
    return (2 if mixed else 1 if group_mixed else 0), abs(rec["advantage"] or 0.0)


def pick_rollout(runs: list[dict]) -> tuple[int, int, int] | None:
    """(run index, step, rollout index) of the rollout to show, or None when no run has a token-logged one. The
    steps are searched from the last one back, until one holds a token-logged rollout of a group with both signs."""
    from rewardlab import rollout_log

    best, best_score = None, None
    for run in runs:
        if run.get("error"):
            continue
        for step in reversed(rollout_log.logged_steps(run["path"])):
            table = rollout_log.read_step(run["path"], step).to_pylist()
            signs: dict[int, set[int]] = {}
            for rec in table:
                if rec["advantage"]:
                    signs.setdefault(rec["group"], set()).add(1 if rec["advantage"] > 0 else -1)
            for rec in table:
                if rec["tokens"] is None:
                    continue
                score = _score(rec, len(signs.get(rec["group"], ())) == 2)
                if best_score is None or score > best_score:
                    best, best_score = (run["index"], step, rec["index"]), score
            if best_score is not None and best_score[0] >= 1:
                break
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", help="run directories (or directories holding runs)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"), help="folder of the PNG files")
    parser.add_argument("--metric", default="reward/mean", help="the metric the metrics page plots")
    parser.add_argument("--smoothing", type=float, default=None,
                        help="the metrics page's smoothing (0: raw values; default: the page's own)")
    args = parser.parse_args(argv)
    if bf.missing():
        print(f"viewer_screenshots: {bf.missing()}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / ".viewer_screenshots.log"
    with bf.viewer([Path(p) for p in args.run_dirs], log) as url, bf.browser_context({"width": 1280, "height": 860}) \
            as context:
        runs = _get(f"{url}/api/runs")["runs"]
        plotted = [r["index"] for r in runs if not r.get("error") and args.metric in
                   {k for rec in _get(f"{url}/api/runs/{r['index']}/metrics")["records"] for k in rec}]
        if not plotted:
            print(f"viewer_screenshots: no run logs the metric {args.metric!r}", file=sys.stderr)
            return 2
        page = context.new_page()
        page.goto(f"{url}/metrics?runs={','.join(map(str, plotted))}&metric={args.metric}", wait_until="networkidle")
        page.wait_for_selector("#metrics-chart .main-svg", timeout=30_000)
        if args.smoothing is not None:
            page.fill("#smoothing", str(args.smoothing))
            page.dispatch_event("#smoothing", "change")
            page.evaluate("() => document.activeElement && document.activeElement.blur()")
        page.wait_for_timeout(500)
        page.screenshot(path=str(out / "viewer_metrics.png"))
        print(f"wrote {out / 'viewer_metrics.png'} (runs {', '.join(runs[i]['name'] for i in plotted)})")
        chosen = pick_rollout(runs)
        if chosen is None:
            print("viewer_screenshots: no run has a token-logged rollout (rl.logging.log_tokens); "
                  f"{out / 'viewer_rollout.png'} not written", file=sys.stderr)
            return 1
        run, step, index = chosen
        page.goto(f"{url}/runs/{run}/steps/{step}/rollouts/{index}", wait_until="networkidle")
        page.wait_for_selector("span.token", timeout=30_000)
        page.wait_for_timeout(300)
        page.screenshot(path=str(out / "viewer_rollout.png"))
        print(f"wrote {out / 'viewer_rollout.png'} (run {runs[run]['name']}, step {step}, rollout {index})")
    log.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
