"""env:python end to end through `evaluate_policy`: a chat model (scripted over a character tokenizer with a
ChatML template) runs code with the run_python tool in the sandbox, then answers; the task's reward spec (code,
fenced) scores the final turn's ```python block once per episode."""

from render_helpers import CHATML, char_tokenizer

from rewardlab.envs import make_env
from rewardlab.envs.sampling import EpisodeSettings
from rewardlab.evaluation.policy import EvalSettings, evaluate_policy
from rewardlab.policy.settings import SamplingSettings
from rewardlab.rewards import build_reward
from rewardlab.tasks import load
from rewardlab.types import Sampled


class Chat:
    """Turn t of every episode writes `turns[t]` (then the template's end of turn, the tokenizer's EOS)."""

    prompt_format, context_window = "chat", 100_000

    def __init__(self, turns):
        self.tokenizer = char_tokenizer(CHATML, specials=("<|im_start|>",))
        self.eos_token_id = self.tokenizer.eos_token_id
        self.turns = turns

    def sample_ids(self, prompts, *, streams, stop=None, **_kw):
        out = []
        for stream in streams:
            text = self.turns[stream[4]]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            ends_in_stop = bool(stop) and any(text.endswith(s) for s in stop)
            ids = ids if ends_in_stop else ids + [self.eos_token_id]
            out.append(Sampled(ids, [0.0] * len(ids), "stop" if ends_in_stop else "eos"))
        return out


def test_python_episode_runs_the_tool_and_the_fenced_answer_is_scored():
    task = load("env:python")
    row = next(r for r in task.test if r["prompt"].isascii() and r["answer"].isascii())
    call = '<tool_call>{"name": "run_python", "arguments": {"code": "print(6*7)"}}</tool_call>'
    good = Chat([call, f"Tested.\n```python\n{row['prompt']}{row['answer']}```"])
    bad = Chat([call, "```python\ndef nothing(): pass\n```"])
    with make_env("python", workers=1) as env:
        settings = EpisodeSettings(env, max_turns=3, max_episode_tokens=20_000, max_tool_tokens=64, name="python")
        right = evaluate_policy(good, [row], build_reward(task.reward), SamplingSettings(max_new_tokens=5_000),
                                settings=EvalSettings(n=0, ks=()), episodes=settings)
        wrong = evaluate_policy(bad, [row], build_reward(task.reward), SamplingSettings(max_new_tokens=5_000),
                                settings=EvalSettings(n=0, ks=()), episodes=settings)
    assert (right["accuracy"], wrong["accuracy"]) == (1.0, 0.0)
    prediction = right["predictions"][0]
    assert [m["role"] for m in prediction["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert prediction["messages"][3]["content"].strip() == "42"  # the sandbox ran the model's code
    assert [[c["status"] for c in turn] for turn in prediction["tool_calls"]] == [["ok"], []]
    assert prediction["termination"] == "stop" and right["tool_call_rate"] == 0.5
