"""Single-turn prompts against the model's context window (issue 31 item 4): `Policy.generate` refuses a prompt that
fills the window and clamps a budget that would run past it (as `sample_ids` does); every verb refuses, at set-up and
before its run directory exists, a task row whose prompt + max_new_tokens does not fit, naming its FILE:LINE; TRL's
`max_prompt_length` (rl., eval.) cuts long prompts from the left instead, counted in one warning."""

import json

import pytest

from conftest import TINY_ARCH, TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.tasks import check_prompt_lengths, check_target_lengths, load

#: The tests' tiny model with a 64-position window, so a prompt past it is a short one.
WINDOW = 64
SMALL = [*TINY_OVERRIDES, f"model.tiny.max_position_embeddings={WINDOW}"]
LONG = "1" * 100 + "="  # 102 tokens with BOS: more than the window


@pytest.fixture
def policy():
    from rewardlab.policy import load_policy

    return load_policy("tiny", tiny_arch={**TINY_ARCH, "max_position_embeddings": WINDOW}, seed=0)


@pytest.fixture
def data(tmp_path):
    """A task file whose third line has a prompt longer than the window."""
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(6)]
    rows.insert(2, {"prompt": LONG, "answer": "1"})
    return write_jsonl(tmp_path / "long.jsonl", rows)


def _err_line(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------------ Policy.generate
def test_generate_refuses_a_prompt_that_fills_the_context_window(policy):
    with pytest.raises(ValueError) as err:  # before: sampled past the window (a 10**6-char prompt: a 1 TB alloc)
        policy.generate(["1+1=", LONG], max_new_tokens=2)
    assert str(err.value) == ("generation.prompts[1]: 102 prompt tokens leave no room in the model's context window of "
                              "64 tokens; shorten the prompt, or cut prompts from the left with max_prompt_length "
                              "(below 64)")


def test_generate_clamps_a_budget_that_would_run_past_the_window(policy):
    prompt = "1" * 59 + "="  # 61 tokens with BOS: 3 left in the window
    (r,) = policy.generate([prompt], greedy=True, max_new_tokens=20)
    assert len(r.prompt_ids) == 61 and len(r.prompt_ids) + len(r.completion_ids) <= WINDOW
    assert len(r.completion_ids) == 3 and r.truncated or r.completion_ids[-1] == policy.eos_token_id


def test_generate_max_prompt_length_keeps_the_last_tokens(policy):
    full = policy.encode_prompt(LONG)
    short, cut = policy.generate(["2+2=", LONG], n=2, max_new_tokens=3, max_prompt_length=16)[::2]
    assert short.prompt_ids == policy.encode_prompt("2+2=") and short.prompt == "2+2="
    assert cut.prompt_ids == full[-16:] and cut.prompt == "1" * 15 + "="  # TRL: prompt_ids[:, -max_prompt_length:]
    with pytest.raises(ValueError, match=r"^generation.max_prompt_length: must be an integer >= 1 or None, got 0$"):
        policy.generate(["1="], max_prompt_length=0)


# ------------------------------------------------------------------------------------------------ the set-up check
def test_check_prompt_lengths_names_the_row_by_file_and_line(data, policy):
    task = load(f"jsonl:{data}")
    with pytest.raises(ValueError) as err:
        check_prompt_lengths(task, policy, max_new_tokens=4, key="rl.sampling.max_new_tokens",
                             prompt_key="rl.sampling.max_prompt_length")
    assert str(err.value) == (
        f"{data}:3: a prompt of 102 tokens + rl.sampling.max_new_tokens=4 is more than the model's context window of "
        f"64 tokens (1 of 7 rows of task jsonl:{data}); shorten that prompt, lower rl.sampling.max_new_tokens, or set "
        "rl.sampling.max_prompt_length to cut long prompts from the left (at most 60)")
    note = check_prompt_lengths(task, policy, max_new_tokens=4, key="rl.sampling.max_new_tokens",
                                max_prompt_length=32, prompt_key="rl.sampling.max_prompt_length")
    assert note == (f"rl.sampling.max_prompt_length: 1 of 7 rows of task jsonl:{data} have prompts longer than 32 "
                    f"tokens; they are cut from the left to their last 32 tokens (first at {data}:3, 102 tokens)")
    with pytest.raises(ValueError, match=r"^rl.sampling.max_prompt_length: 61 \+ rl.sampling.max_new_tokens=4 is more "
                                         r"than the model's context window of 64 tokens; lower "
                                         r"rl.sampling.max_prompt_length to at most 60"):
        check_prompt_lengths(task, policy, max_new_tokens=4, key="rl.sampling.max_new_tokens", max_prompt_length=61,
                             prompt_key="rl.sampling.max_prompt_length")
    with pytest.raises(ValueError, match=r"^search.max_new_tokens: 64 tokens leave no room for a prompt"):
        check_prompt_lengths(task, policy, max_new_tokens=64, key="search.max_new_tokens")
    short = load(f"jsonl:{write_jsonl(data.parent / 'short.jsonl', [{'prompt': '1+1=', 'answer': '2'}])}")
    assert check_prompt_lengths(short, policy, max_new_tokens=4, key="rl.sampling.max_new_tokens") is None


# ------------------------------------------------------------------------------------------------ the verbs
def test_train_refuses_a_prompt_past_the_window_before_the_run_starts(tmp_path, capsys, data):
    out = tmp_path / "run"
    rc = main(["train", "--no-progress", "--task", f"jsonl:{data}", "--out", str(out), "rl.steps=1",
               "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=4", *SMALL])
    assert rc == 2 and not out.exists()  # before: rc 0, the long prompt sampled silently past the window
    assert _err_line(capsys).startswith(f"rewardlab train: error: {data}:3: a prompt of 102 tokens + "
                                        "rl.sampling.max_new_tokens=4 is more than the model's context window of 64 "
                                        "tokens")


def test_train_with_max_prompt_length_cuts_long_prompts_and_says_so(tmp_path, capsys, data):
    out = tmp_path / "run"
    rc = main(["train", "--no-progress", "--task", f"jsonl:{data}", "--out", str(out), "rl.steps=2",
               "rl.prompts_per_step=7", "rl.group_size=2", "rl.sampling.max_new_tokens=4",
               "rl.sampling.max_prompt_length=32", "rl.eval.every=1", "rl.eval.n=7", "task.options={test_size: 0.5}",
               *SMALL])
    assert rc == 0, capsys.readouterr().err[-2000:]
    assert (f"rewardlab: warning: rl.sampling.max_prompt_length: 1 of 7 rows of task jsonl:{data} have prompts "
            f"longer than 32 tokens; they are cut from the left to their last 32 tokens (first at {data}:3, 102 tokens)"
            ) in capsys.readouterr().err
    assert "eval/accuracy" in json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])  # held out, cut too


def test_max_prompt_length_too_long_for_the_window_is_refused(tmp_path, capsys, data):
    out = tmp_path / "run"
    assert main(["train", "--no-progress", "--task", f"jsonl:{data}", "--out", str(out), "rl.sampling.max_new_tokens=4",
                 "rl.sampling.max_prompt_length=61", *SMALL]) == 2
    assert _err_line(capsys) == ("rewardlab train: error: rl.sampling.max_prompt_length: 61 + "
                                 "rl.sampling.max_new_tokens=4 is more than the model's context window of 64 tokens; "
                                 "lower rl.sampling.max_prompt_length to at most 60 (or rl.sampling.max_new_tokens)"
                                 ) and not out.exists()


def test_max_prompt_length_on_an_environment_task_is_refused(tmp_path, capsys):
    assert main(["train", "--task", "env:calculator", "--out", str(tmp_path / "run"),
                 "rl.sampling.max_prompt_length=32"]) == 2
    assert "rl.sampling.max_prompt_length: cuts single-turn prompts, and 'env:calculator' is an environment task" in (
        _err_line(capsys))


def test_evaluate_refuses_then_cuts_with_eval_max_prompt_length(tmp_path, capsys, data):
    args = ["evaluate", "--no-progress", "--task", f"jsonl:{data}", "eval.n=2", "eval.k=[1]", "eval.max_new_tokens=4",
            *SMALL]
    assert main([*args, "--out", str(tmp_path / "refused")]) == 2 and not (tmp_path / "refused").exists()
    assert _err_line(capsys).startswith(f"rewardlab evaluate: error: {data}:3: a prompt of 102 tokens + "
                                        "eval.max_new_tokens=4 is more than the model's context window of 64 tokens")
    assert main([*args, "--out", str(tmp_path / "cut"), "eval.max_prompt_length=16"]) == 0
    assert "eval.max_prompt_length: 1 of 7 rows" in capsys.readouterr().err
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary["n_questions"] == 7


def test_search_refuses_a_prompt_past_the_window(tmp_path, capsys, data):
    out = tmp_path / "run"
    assert main(["search", "--no-progress", "--task", f"jsonl:{data}", "--out", str(out), "search.n=[1]",
                 "search.methods=[best_of_n]", "search.max_new_tokens=4", *SMALL]) == 2
    assert _err_line(capsys).startswith(f"rewardlab search: error: {data}:3: a prompt of 102 tokens + "
                                        "search.max_new_tokens=4 is more than the model's context window of 64 tokens")
    assert not out.exists()


def test_sft_refuses_a_training_row_past_the_window(tmp_path, capsys, data, policy):
    out = tmp_path / "run"
    assert main(["sft", "--no-progress", "--task", f"jsonl:{data}", "--out", str(out), "sft.steps=1",
                 "sft.batch_size=2", "task.options={test_size: 0}", *SMALL]) == 2
    assert _err_line(capsys) == (
        f"rewardlab sft: error: {data}:3: a prompt of 102 tokens + target 'answer' of 2 tokens (EOS included) is more "
        f"than the model's context window of 64 tokens (1 of 7 training rows of task jsonl:{data}); shorten them or "
        "use a model with a longer context window") and not out.exists()
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2" * 20}])  # 21 target tokens
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "3" * 48 + "=", "answer": "3"}])  # 50 prompt tokens
    task = load(f"jsonl:{train}", test_path=str(test))
    check_target_lengths(task, policy, target="answer")  # no held-out evaluation: the training row fits
    with pytest.raises(ValueError) as err:
        check_target_lengths(task, policy, target="answer", eval_rows=task.test)
    assert str(err.value) == (f"sft.eval_every: held-out row {test}:1: a prompt of 50 tokens + 21 tokens (the longest "
                              "training target, the held-out completion limit) is more than the model's context "
                              "window of 64 tokens; shorten the held-out prompts, or set sft.eval_every=0")


@pytest.mark.parametrize("verb,key", [(["rm", "pairs"], "pairs.max_new_tokens"), (["prm", "label"],
                                                                                    "label.max_new_tokens")])
def test_rm_pairs_and_prm_label_refuse_a_prompt_past_the_window(tmp_path, capsys, data, verb, key):
    out = tmp_path / "run"
    assert main([*verb, "--no-progress", "--task", f"jsonl:{data}", "--out", str(out), f"{key}=4",
                 *SMALL]) == 2
    assert _err_line(capsys).startswith(f"rewardlab {' '.join(verb)}: error: {data}:3: a prompt of 102 tokens + "
                                        f"{key}=4 is more than the model's context window of 64 tokens")
    assert not out.exists()
