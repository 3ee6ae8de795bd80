"""Episodes per second in the `python` environment: tool calls stepped one episode after another (how the episode
loop stepped before issue 31 item 7) against one concurrent step per round (`ToolEnv.step_batch`), side by side in
one process, on the same pool size.

The model is scripted, so the figure is the environment's: each episode's first turn calls `run_python` (hermes
format) and its second answers. Workloads (`--program`):
    tests  the row's HumanEval solution and its tests, `check(entry_point)`: what a model testing its answer runs;
    sleep  a program that sleeps `--sleep` seconds: a tool that waits (a slow service, a hanging call cut short).
Both arms must give the same episodes (checked; a call's measured seconds aside).

    python benchmarks/agents_tool_concurrency.py --episodes 16 --workers 4 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from rewardlab.envs import EpisodeSettings, PythonEnv, run_episodes
from rewardlab.policy.settings import SamplingSettings
from rewardlab.types import Sampled

EOS = 0


class CodepointRenderer:
    """A raw renderer whose ids are Unicode code points (0 is EOS): code and JSON pass through exactly."""

    def __init__(self, env):
        self.raw_text = env.raw_text

    def _text(self, messages):
        return "".join(self.raw_text(m) if m["role"] == "tool" else m["content"] for m in messages)

    def start(self, messages):
        return [ord(c) for c in self._text(messages)]

    def extend(self, row_ids, history, new):
        return [ord(c) for c in self._text(new)]

    def turn_text(self, ids):
        return "".join(chr(i) for i in ids if i != EOS)

    decode = turn_text

    def clip(self, text, max_tokens, keep="start"):
        return text


class ScriptedPolicy:
    """A `TokenSampler` that writes episode e's turn t as `scripts[e][t]` (EOS appended to a turn without a call)."""

    eos_token_id = EOS
    context_window = None

    def __init__(self, scripts):
        self.scripts = scripts

    def sample_ids(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, greedy=False, stop=None,
                   streams=None):
        out = []
        for stream in streams:
            text = self.scripts[stream[2]][stream[4]]
            call = bool(stop) and any(text.endswith(s) for s in stop)
            ids = [ord(c) for c in text] + ([] if call else [EOS])
            out.append(Sampled(ids, [0.0] * len(ids), "stop" if call else "eos"))
        return out


def program(row, kind, sleep_s):
    if kind == "sleep":
        return f"import time\ntime.sleep({sleep_s})\nprint('slept')\n"
    return f"{row['prompt']}{row['answer']}\n{row['test']}\ncheck({row['entry_point']})\nprint('passed')\n"


def scripts_for(rows, kind, sleep_s):
    out = {}
    for e, row in enumerate(rows):
        call = json.dumps({"name": "run_python", "arguments": {"code": program(row, kind, sleep_s)}})
        answer = f"```python\n{row['prompt']}{row['answer']}```"
        out[e] = [f"<tool_call>{call}</tool_call>", answer]
    return out


class SerialPythonEnv(PythonEnv):
    """The python environment stepped one episode after another (it overrides `step`, so `step_batch` falls back to
    serial steps): the episode loop's behaviour before concurrent steps."""

    def step(self, state, action):
        return super().step(state, action)


def run_arm(env_cls, rows, scripts, workers):
    with env_cls(workers=workers) as env:
        renderer = CodepointRenderer(env)
        episodes = EpisodeSettings(env, max_turns=2, max_episode_tokens=16384)
        sampling = SamplingSettings(max_new_tokens=4096)
        warm = run_episodes(ScriptedPolicy(scripts), episodes, rows[:1], sampling, n=1,
                            renderer=renderer)  # start the pool's workers
        assert warm[0].tool_calls[0][0]["status"] == "ok", warm[0].tool_calls
        start = time.perf_counter()
        out = run_episodes(ScriptedPolicy(scripts), episodes, rows, sampling, n=1, renderer=renderer)
        seconds = time.perf_counter() - start
    for r in out:
        r.tool_calls = [[dict(c, seconds=None) for c in turn] for turn in r.tool_calls]
    return seconds, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--workers", type=int, default=4, help="tool pool workers (both arms)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each arm, alternating; the median is reported")
    ap.add_argument("--program", choices=["tests", "sleep", "both"], default="both")
    ap.add_argument("--sleep", type=float, default=1.0, help="seconds the sleep program sleeps")
    args = ap.parse_args()

    env = PythonEnv()
    rows = env.rows("all", n=args.episodes)
    env.close()
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.episodes} episodes of 2 turns (one run_python "
          f"call), {args.workers} tool workers, median of {args.repeats}")
    kinds = ["tests", "sleep"] if args.program == "both" else [args.program]
    for kind in kinds:
        scripts = scripts_for(rows, kind, args.sleep)
        times = {"serial": [], "concurrent": []}
        outs = {}
        for _ in range(args.repeats):
            for name, cls in (("serial", SerialPythonEnv), ("concurrent", PythonEnv)):
                seconds, outs[name] = run_arm(cls, rows, scripts, args.workers)
                times[name].append(seconds)
        assert outs["serial"] == outs["concurrent"], "the arms gave different episodes"
        statuses = {c["status"] for r in outs["concurrent"] for turn in r.tool_calls for c in turn}
        serial, concurrent = statistics.median(times["serial"]), statistics.median(times["concurrent"])
        print(f"{kind:6s} serial {args.episodes / serial:6.2f} episodes/s ({serial:.2f} s)   concurrent "
              f"{args.episodes / concurrent:6.2f} episodes/s ({concurrent:.2f} s)   x{serial / concurrent:.2f}   "
              f"statuses {sorted(statuses)}, same episodes: yes")


if __name__ == "__main__":
    main()
