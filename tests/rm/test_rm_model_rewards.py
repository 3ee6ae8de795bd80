"""reward_model / process_reward_model: input formats, aggregation, and tiny BT / PRM training round trips."""

import json
import math

import pytest
import torch

from conftest import TINY_ARCH, write_jsonl
from rewardlab.config import PrmTrainConfig, RmTrainConfig
from rewardlab.policy.tiny import build_tokenizer
from rewardlab.rewards import build_reward
from rewardlab.rewards.model import encode_outcome, encode_process
from rewardlab.rewards.steps import aggregate_steps
from rewardlab.commands.rm import train as run_rm_train
from rewardlab.rm.data import make_rollout
from rewardlab.commands.prm import train as run_prm_train


# ---------------------------------------------------------------- formats
def test_encode_process_reads_the_last_token_of_each_tag():
    tok = build_tokenizer()  # one token per character, <s> first
    ids, pos = encode_process(tok, "1+2=", ["1+2=3", " 3+4=7\n"], " <step>")
    # text: "1+2=" (4 chars) "\n1+2=3 <step>" (13) "\n3+4=7 <step>" (13) = 30 chars; steps are stripped.
    # tag ends at characters 16 and 29; with <s> at token 0 they are tokens 17 and 30.
    assert tok.decode(ids, skip_special_tokens=True) == "1+2=\n1+2=3 <step>\n3+4=7 <step>"
    assert pos == [17, 30] and len(ids) == 31
    assert tok.convert_ids_to_tokens([ids[17], ids[30]]) == [">", ">"]


def test_encode_process_with_a_wordpiece_tokenizer():
    from transformers import AutoTokenizer

    from rewardlab.rm.backbone import minilm_path

    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    ids, pos = encode_process(tok, "3+4-2=", ["3+4=7", "7-2=5"], " <step>")
    tokens = tok.convert_ids_to_tokens(ids)
    # [CLS] 3 + 4 - 2 = 3 + 4 = 7 < step > 7 - 2 = 5 < step > [SEP]: the tags' ">" are tokens 14 and 22
    assert [tokens[p] for p in pos] == [">", ">"] and pos == [14, 22]
    with pytest.raises(ValueError, match="no token of its own"):
        encode_process(tok, "q", ["a"], " # ")  # BERT drops the tag's last character, a space
    with pytest.raises(ValueError, match="step_tag: must contain a non-whitespace"):
        encode_process(tok, "q", ["a"], "\n")


def test_encode_process_too_long_names_the_count():
    with pytest.raises(ValueError, match="31 tokens, more than max_length=20"):
        encode_process(build_tokenizer(), "1+2=", ["1+2=3", "3+4=7"], " <step>", max_length=20)


def test_encode_outcome_uses_the_chat_template_when_there_is_one():
    tok = build_tokenizer()
    plain = encode_outcome(tok, ["2+2="], ["4"], 64)
    assert tok.decode(plain["input_ids"][0], skip_special_tokens=True) == "2+2=4"  # the tokenizer's text pair
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    chat = encode_outcome(tok, ["2+2="], ["4"], 64)
    assert tok.decode(chat["input_ids"][0], skip_special_tokens=False) == "[user]2+2=[assistant]4"


@pytest.mark.parametrize("how, expected", [("min", 0.2), ("last", 0.5), ("prod", 0.9 * 0.2 * 0.5), ("mean", 1.6 / 3)])
def test_aggregate_steps(how, expected):
    assert aggregate_steps([0.9, 0.2, 0.5], how) == pytest.approx(expected)


def test_aggregate_steps_rejects_unknown():
    with pytest.raises(ValueError, match=r"^aggregate: expected one of \('min', 'last', 'prod', 'mean'\), got 'max'$"):
        aggregate_steps([0.5], "max")


def test_missing_model_directory_is_a_config_error(tmp_path):
    with pytest.raises(ValueError, match=r"rewards\[0\] \(reward_model\): reward_model.path: .* has no config.json "
                                         r"\(not a Hugging Face"):
        build_reward([{"name": "reward_model", "path": str(tmp_path)}])


# ---------------------------------------------------------------- tiny training round trips
def _pairs(prompts, good="yes", bad="no"):
    return [{"prompt": p, "chosen": good, "rejected": bad, "subset": "toy"} for p in prompts]


@pytest.fixture(scope="module")
def tiny_bt(tmp_path_factory):
    d = tmp_path_factory.mktemp("bt")
    train = write_jsonl(d / "train.jsonl", _pairs([f"{i}+{i}=" for i in range(16)]))
    held = write_jsonl(d / "held.jsonl", _pairs([f"{i}-1=" for i in range(8)]))
    cfg = RmTrainConfig(data=str(train), eval_data=str(held), out=str(d / "run"),
                        model={"path": "tiny", "tiny": TINY_ARCH},
                        train={"epochs": 3, "batch_size": 8, "lr": 1e-2, "lr_schedule": "constant"})
    return run_rm_train(cfg, show_progress=False), held


def test_tiny_bradley_terry_learns_and_loads_as_reward_model(tiny_bt):
    summary, held = tiny_bt
    assert summary["steps"] == 6  # 3 epochs x ceil(16 / 8)
    assert summary["final_eval"]["eval/accuracy"] == 1.0  # held-out prompts: "yes" always beats "no"
    reward = build_reward([{"name": "reward_model", "path": summary["final_checkpoint"]}])
    rows = [json.loads(line) for line in held.read_text().splitlines()]
    chosen = reward([make_rollout(r["prompt"], r["chosen"]) for r in rows])
    rejected = reward([make_rollout(r["prompt"], r["rejected"]) for r in rows])
    assert all(o.error is None for o in chosen + rejected)
    # the reward's scores are the trained model's: the same mean margin as the run's own held-out evaluation
    margin = sum(c.score - r.score for c, r in zip(chosen, rejected)) / len(rows)
    assert margin == pytest.approx(summary["final_eval"]["eval/margin_mean"], rel=1e-4)
    assert margin > 0


def test_bt_run_directory(tiny_bt):
    summary, _ = tiny_bt
    run = summary["final_checkpoint"].rsplit("/checkpoints/", 1)[0]
    lines = [json.loads(x) for x in open(f"{run}/metrics.jsonl")]
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5, 6]
    assert "eval/accuracy" in lines[-1] and "train/loss" in lines[-1]  # the eval lands on the same step line
    assert all(k in lines[0] for k in ("train/margin_mean", "train/reward_mean", "train/reward_std"))


def _step_rows(n):
    # a step containing "bad" is wrong (label 0); "ok" steps are right (label 1)
    rows = []
    for i in range(n):
        steps = ["ok", "ok", "bad"] if i % 2 else ["ok", "bad", "bad"]
        rows.append({"prompt": f"q{i}", "steps": steps, "labels": [0.0 if s == "bad" else 1.0 for s in steps]})
    return rows


@pytest.fixture(scope="module")
def tiny_prm(tmp_path_factory):
    d = tmp_path_factory.mktemp("prm")
    train = write_jsonl(d / "train.jsonl", _step_rows(16))
    held = write_jsonl(d / "held.jsonl", _step_rows(6))
    cfg = PrmTrainConfig(data=str(train), eval_data=str(held), out=str(d / "run"),
                         model={"path": "tiny", "tiny": TINY_ARCH},
                         train={"epochs": 4, "batch_size": 8, "lr": 1e-2, "lr_schedule": "constant"})
    return run_prm_train(cfg, show_progress=False)


def test_tiny_prm_learns_and_loads_as_process_reward_model(tiny_prm):
    assert tiny_prm["final_eval"]["eval/step_accuracy"] == 1.0
    ckpt = tiny_prm["final_checkpoint"]
    config = json.load(open(f"{ckpt}/config.json"))
    assert config["step_tag"] == " <step>" and config["step_separator"] == "\n"
    prm = build_reward([{"name": "process_reward_model", "path": ckpt, "aggregate": "min"}])
    marked = make_rollout("q1", "ok\nbad", step_text=["ok\n", "bad"])
    unmarked = make_rollout("q1", "ok\nbad")  # steps from split_steps(completion, "\n")
    a, b = prm([marked, unmarked])
    assert a.error is None and len(a.step_scores) == 2
    assert a.step_scores[0] > 0.5 > a.step_scores[1]
    assert a.step_scores == pytest.approx(b.step_scores, abs=1e-6)  # one format for marked and split steps
    assert a.score == pytest.approx(min(a.step_scores))  # aggregate=min; the composed score has weight 1


def test_prm_aggregates_and_errors(tiny_prm):
    ckpt = tiny_prm["final_checkpoint"]
    r = make_rollout("q1", "ok\nok\nbad")
    outs = {how: build_reward([{"name": "process_reward_model", "path": ckpt, "aggregate": how}])([r])[0]
            for how in ("min", "last", "prod", "mean")}
    p = outs["min"].step_scores
    assert outs["last"].score == pytest.approx(p[-1])
    assert outs["prod"].score == pytest.approx(math.prod(p))
    assert outs["mean"].score == pytest.approx(sum(p) / 3)
    empty = build_reward([{"name": "process_reward_model", "path": ckpt}])([make_rollout("q", "")])[0]
    assert empty.error == "process_reward_model: the completion has no steps"


def test_prm_and_bt_checkpoints_are_not_interchangeable(tiny_bt, tiny_prm):
    with pytest.raises(ValueError, match="no step_tag"):
        build_reward([{"name": "process_reward_model", "path": tiny_bt[0]["final_checkpoint"]}])


def test_scores_are_deterministic_in_inference_mode(tiny_bt):
    reward = build_reward([{"name": "reward_model", "path": tiny_bt[0]["final_checkpoint"], "batch_size": 1}])
    batched = build_reward([{"name": "reward_model", "path": tiny_bt[0]["final_checkpoint"], "batch_size": 8}])
    rs = [make_rollout("1+1=", "yes"), make_rollout("2+2=", "a longer answer")]
    assert [o.score for o in reward(rs)] == pytest.approx([o.score for o in batched(rs)], abs=1e-5)
    assert torch.is_grad_enabled()  # inference_mode is scoped to the scoring call
