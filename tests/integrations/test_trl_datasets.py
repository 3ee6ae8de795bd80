"""rewardlab data in TRL's dataset formats and back, checked with TRL's own data utilities and DPOTrainer's
dataset preparation."""

import json

import pytest

pytest.importorskip("trl")
from trl.data_utils import extract_prompt, is_conversational, maybe_apply_chat_template  # noqa: E402

from rewardlab.integrations.trl import (  # noqa: E402
    pairs_to_trl, step_rows_to_trl, trl_to_pairs, trl_to_rows, trl_to_task,
)
from rewardlab.rm.data import Pair, StepRow, parse_steps  # noqa: E402

PAIRS = [Pair(prompt="Q: 2+2?\n", chosen="4", rejected="5"),
         Pair(prompt="Q: 3*3?\n", chosen="9", rejected="6", margin=0.5)]

CHATML = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
          "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_pairs_explicit_standard_columns_and_values():
    ds = pairs_to_trl(PAIRS)
    assert ds.column_names == ["prompt", "chosen", "rejected", "margin"]
    assert ds[1] == {"prompt": "Q: 3*3?\n", "chosen": "9", "rejected": "6", "margin": 0.5}
    assert not is_conversational(ds[0])
    assert "margin" not in pairs_to_trl(PAIRS[:1]).column_names  # no margin anywhere: no column


def test_pairs_conversational_is_what_trl_calls_conversational_and_templates():
    ds = pairs_to_trl(PAIRS[:1], conversational=True)
    row = ds[0]
    assert is_conversational(row)
    assert row["prompt"] == [{"role": "user", "content": "Q: 2+2?\n"}]
    assert row["chosen"] == [{"role": "assistant", "content": "4"}]

    class Tok:  # the least TRL's chat-template helper needs: apply_chat_template of transformers
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kwargs):
            from jinja2 import Template
            return Template(CHATML).render(messages=messages, add_generation_prompt=add_generation_prompt)

    out = maybe_apply_chat_template(row, Tok())
    assert out["prompt"] == "<user>Q: 2+2?\n\n<assistant>"
    assert out["chosen"] == "4\n"  # TRL renders prompt + response and keeps what follows the prompt


@pytest.mark.parametrize("conversational", [False, True])
def test_implicit_prompt_is_taken_back_out_by_trls_extract_prompt(conversational):
    explicit = pairs_to_trl(PAIRS, conversational=conversational)
    implicit = pairs_to_trl(PAIRS, conversational=conversational, implicit_prompt=True)
    assert "prompt" not in implicit.column_names
    for e, i in zip(explicit, implicit):
        assert extract_prompt({"chosen": i["chosen"], "rejected": i["rejected"]}) == \
            {"prompt": e["prompt"], "chosen": e["chosen"], "rejected": e["rejected"]}


@pytest.mark.parametrize("conversational,implicit", [(False, False), (True, False), (False, True), (True, True)])
def test_pairs_round_trip(conversational, implicit):
    back = trl_to_pairs(pairs_to_trl(PAIRS, conversational=conversational, implicit_prompt=implicit))
    assert [(p.prompt, p.chosen, p.rejected, p.margin) for p in back] == \
        [(p.prompt, p.chosen, p.rejected, p.margin) for p in PAIRS]


def test_pairs_from_an_rm_pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected,
                                        "subset": "s", "margin": p.margin}) + "\n" for p in PAIRS))
    assert pairs_to_trl(path)["chosen"] == ["4", "9"]
    path.write_text('{"prompt": "x", "chosen": "y"}\n')
    with pytest.raises(ValueError, match=r"pairs.jsonl:1: "):
        pairs_to_trl(str(path))


def test_implicit_prompt_is_exact_for_every_pair_of_an_rm_pairs_file_or_refused(tmp_path):
    """A real `rm pairs` file (tiny model, low temperature so that answers often share a first character): TRL's
    own extract_prompt applied to the implicit rows gives back each pair's prompt exactly; a string pair whose
    prompt TRL would not recover (a shared first character, an empty response) is refused, naming it."""
    import string

    from conftest import TINY_OVERRIDES, read_jsonl, write_jsonl
    from rewardlab.cli import main
    from rewardlab.rm.data import load_pairs

    # correct (exact_match against the references): an answer ending in every other printable character
    chars = string.digits + string.ascii_letters + string.punctuation
    good = chars[::2]
    refs = [a + b for a in chars for b in good] + list(good)
    task = write_jsonl(tmp_path / "task.jsonl", [{"prompt": f"{i}=", "answer": good[0], "references": refs}
                                                 for i in range(14)])
    assert main(["rm", "pairs", "--no-progress", "--model", "tiny", "--task", f"jsonl:{task}",
                 "--out", str(tmp_path / "pairs"), "task.options={test_size: 2}", "pairs.n=16",
                 "pairs.max_new_tokens=2", "pairs.temperature=0.1", "pairs.pairs_per_question=4",
                 *TINY_OVERRIDES]) == 0
    path = tmp_path / "pairs" / "pairs.jsonl"
    pairs = load_pairs(path)
    assert len(pairs) == len(read_jsonl(path)) > 20

    chat = pairs_to_trl(path, conversational=True, implicit_prompt=True)
    for p, row in zip(pairs, chat):  # a conversational pair always splits at the assistant turn
        assert extract_prompt(row)["prompt"] == [{"role": "user", "content": p.prompt}]
    refused = []
    for i, p in enumerate(pairs):
        try:
            (row,) = pairs_to_trl([p], implicit_prompt=True)
        except ValueError as exc:
            assert str(exc).startswith("pairs_to_trl: pair 0: implicit_prompt=True would lose its prompt: TRL's "
                                       "extract_prompt")
            refused.append(i)
            continue
        assert extract_prompt(row) == {"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}
    # never refused: responses that differ in their first character (the prompt ends in "=", not a space)
    assert not [i for i in refused if pairs[i].chosen[:1] != pairs[i].rejected[:1] and pairs[i].chosen
                and pairs[i].rejected]
    assert 0 < len(refused) < len(pairs)  # the file has both kinds; the refused ones share a first character
    with pytest.raises(ValueError, match=rf"^pairs_to_trl: pair {refused[0]}: implicit_prompt=True would lose"):
        pairs_to_trl(path, implicit_prompt=True)


def test_dpo_trainer_prepares_the_exported_pairs(tmp_path):
    """DPOTrainer's own dataset preparation reads the columns and tokenizes prompt and responses as given."""
    from trl import DPOConfig, DPOTrainer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rewardlab.policy.tiny import create_tiny

    path = create_tiny(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    args = DPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", per_device_train_batch_size=2,
                     max_steps=1, dataset_num_proc=None)
    trainer = DPOTrainer(model=model, args=args, train_dataset=pairs_to_trl(PAIRS), processing_class=tok)
    row = trainer.train_dataset[1]
    assert tok.decode(row["prompt_ids"]) == "<s>Q: 3*3?\n"  # the tiny tokenizer adds its BOS
    assert tok.decode(row["chosen_ids"]) == "9</s>"
    assert tok.decode(row["rejected_ids"]) == "6</s>"


def test_step_rows_in_trls_stepwise_supervision_format():
    rows = [StepRow("2+3*4?", ["3*4=12\n", "2+12=14\n", "so 15"], [1.0, 0.8, 0.2]),
            StepRow("1+1?", ["1+1=2"], [1.0])]
    ds = step_rows_to_trl(rows)
    assert ds.column_names == ["prompt", "completions", "labels"]
    assert ds[0] == {"prompt": "2+3*4?", "completions": ["3*4=12\n", "2+12=14\n", "so 15"],
                     "labels": [True, True, False]}
    assert not is_conversational(ds[0])
    assert step_rows_to_trl(rows, threshold=0.9)[0]["labels"] == [True, False, False]
    back = parse_steps({"prompt": ds[0]["prompt"], "steps": ds[0]["completions"], "labels": ds[0]["labels"]}, "x")
    assert back.labels == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match=r"threshold: expected a number in \(0, 1\], got 0"):
        step_rows_to_trl(rows, threshold=0)


def test_trl_prompt_datasets_as_rewardlab_rows():
    from datasets import Dataset

    plain = Dataset.from_dict({"prompt": ["2+2?"], "answer": ["4"], "level": [1]})
    assert trl_to_rows(plain) == [{"prompt": "2+2?", "answer": "4", "level": 1}]
    chat = Dataset.from_dict({"prompt": [[{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": "2+2?"}]],
                              "completion": [[{"role": "assistant", "content": "4"}]]})
    assert trl_to_rows(chat) == [{"prompt": "2+2?", "answer": "4",
                                  "messages": [{"role": "system", "content": "be brief"},
                                               {"role": "user", "content": "2+2?"}]}]
    both = Dataset.from_dict({"prompt": ["2+2?"], "completion": ["2+2 is 4"], "solution": ["4"]})
    assert trl_to_rows(both, answer="solution") == [{"prompt": "2+2?", "answer": "4", "target": "2+2 is 4"}]
    with pytest.raises(ValueError, match=r"^dataset row 0: no reference answer: neither an 'answer' column nor a "
                                         r"'completion' \(columns: prompt, solution\); name the answer column"):
        trl_to_rows(Dataset.from_dict({"prompt": ["2+2?"], "solution": ["4"]}))
    with pytest.raises(ValueError, match=r"^dataset row 0: no 'prompt' column \(columns: text\)$"):
        trl_to_rows(Dataset.from_dict({"text": ["hi"]}))


def test_trl_dataset_as_a_task():
    from datasets import Dataset

    ds = Dataset.from_dict({"prompt": [f"{i}+1?" for i in range(10)] + ["0+1?"],
                            "answer": [str(i + 1) for i in range(10)] + ["1"]})
    task = trl_to_task(ds, test_size=2, seed=0)
    assert len(task.train) == 8 and len(task.test) == 2  # the repeated prompt counted once
    assert not {r["prompt"] for r in task.train} & {r["prompt"] for r in task.test}
    assert [r["prompt"] for r in task.split("all")] == [f"{i}+1?" for i in range(10)]
