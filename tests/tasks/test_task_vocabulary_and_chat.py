"""What a task loader refuses and describes: null/empty answers, characters the policy's tokenizer cannot encode,
chat rows (TRL's `messages` format) with and without a chat template, the JSONL options, the one-line task summary."""

import json

import pytest

from conftest import TINY_ARCH, TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
import rewardlab.tasks as tasks
from rewardlab.tasks import load
from rewardlab.tasks.jsonl import read_rows

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SMALL_RL = ["rl.steps=1", "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=2", "save_every=1"]


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1]


# ---------------------------------------------------------------- null and empty answers
@pytest.mark.parametrize("answer, why", [(None, "is null"), ("", "is empty"), ("  ", "is empty")])
def test_a_null_or_empty_answer_is_a_file_line_error(tmp_path, answer, why):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": answer}])
    # before: null became the string "null" and "" was accepted as a reference answer
    with pytest.raises(ValueError) as err:
        read_rows(path)
    assert str(err.value).startswith(f"{path}:2: field 'answer' {why}")


def test_an_empty_prompt_is_a_file_line_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "", "answer": "2"}])
    with pytest.raises(ValueError, match=rf"^{tmp_path}/d.jsonl:1: field 'prompt' is empty$"):
        read_rows(path)


# ---------------------------------------------------------------- characters outside the vocabulary
UNITS = [
    {"prompt": "Convert 0C to F", "answer": "32F"},
    {"prompt": "Convert 100C to F", "answer": "212\u00b0F"},  # degree sign: <unk> for the tiny tokenizer
    {"prompt": "Convert 10C to F", "answer": "50F"},
    {"prompt": "Compute 2 \u00d7 3", "answer": "6"},  # multiplication sign in the prompt
]


def test_unknown_characters_are_counted_and_the_first_file_line_named(tmp_path, tiny_policy):
    path = write_jsonl(tmp_path / "units.jsonl", UNITS)
    task = load(f"jsonl:{path}")
    with pytest.raises(ValueError) as err:
        tasks.check_task_vocabulary(task, tiny_policy.tokenizer)
    assert str(err.value) == (
        f"task jsonl:{path}: 2 of 4 rows hold characters outside the model's vocabulary (its tokenizer encodes them "
        f"as '<unk>', so the model can neither read nor write them): first at {path}:2 field 'answer': '\u00b0' "
        "(U+00B0); unknown characters: '\u00b0' (U+00B0), '\u00d7' (U+00D7); replace them in the data, or use a model "
        "whose tokenizer covers them")
    ascii_only = load(f"jsonl:{write_jsonl(tmp_path / 'ok.jsonl', [UNITS[0], UNITS[2]])}")
    tasks.check_task_vocabulary(ascii_only, tiny_policy.tokenizer)  # nothing unknown: no error


def test_the_unknown_token_spelled_in_the_text_is_not_an_unknown_character(tmp_path, tiny_policy):
    from rewardlab.policy.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.split_special_tokens = False  # now the text "<unk>" encodes as the unknown token's id
    assert tokenizer("<unk>", add_special_tokens=False)["input_ids"] == [tokenizer.unk_token_id]
    task = load(f"jsonl:{write_jsonl(tmp_path / 'd.jsonl', [{'prompt': 'say <unk>', 'answer': '<unk>'}])}")
    tasks.check_task_vocabulary(task, tokenizer)


def _byte_fallback_tokenizer():
    """A BPE tokenizer with byte fallback (as Llama's and Mistral's): a character outside its vocabulary becomes its
    UTF-8 byte tokens, never the unknown token, although it has one."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, **{f"<0x{b:02X}>": 2 + b for b in range(256)}}
    for c in map(chr, range(32, 127)):
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.ByteFallback()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


def test_a_byte_fallback_tokenizer_knows_every_character(tmp_path):
    tokenizer = _byte_fallback_tokenizer()
    assert tokenizer("\u00b0", add_special_tokens=False)["input_ids"] == [2 + 0xC2, 2 + 0xB0]  # bytes, not <unk>
    task = load(f"jsonl:{write_jsonl(tmp_path / 'units.jsonl', UNITS + [{'prompt': 'a <unk>', 'answer': '1'}])}")
    tasks.check_task_vocabulary(task, tokenizer)  # no false alarm, the literal "<unk>" included


def test_train_refuses_unknown_characters_before_creating_the_run(tmp_path, capsys):
    data = write_jsonl(tmp_path / "units.jsonl", UNITS)
    out = tmp_path / "run"
    # before: the run trained on answers the model could not write (0% accuracy) and exited 0
    assert main(["train", "--no-progress", "--task", f"jsonl:{data}", "--out", str(out), *SMALL_RL,
                 *TINY_OVERRIDES]) == 2
    line = _err_line(capsys)
    assert line.startswith(f"rewardlab train: error: task jsonl:{data}: 2 of 4 rows hold characters outside")
    assert f"first at {data}:2 field 'answer': '\u00b0' (U+00B0)" in line
    assert not out.exists()


def test_sft_refuses_unknown_characters(tmp_path, capsys):
    data = write_jsonl(tmp_path / "units.jsonl", UNITS)
    assert main(["sft", "--no-progress", "--task", f"jsonl:{data}", "--out", str(tmp_path / "sft"), "sft.steps=1",
                 "sft.batch_size=2", *TINY_OVERRIDES]) == 2
    assert f"first at {data}:2 field 'answer'" in _err_line(capsys)


# ---------------------------------------------------------------- chat rows
CHAT = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="},
                  {"role": "assistant", "content": "2"}]},
    {"messages": [{"role": "user", "content": "2+2="}], "answer": "4", "level": 1},
    {"messages": [{"role": "user", "content": "3+3="}, {"role": "assistant", "content": "It is 6"}], "answer": "6"},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                  {"role": "user", "content": "4+4="}, {"role": "assistant", "content": "8"}]},
]


def test_chat_rows_become_task_rows(tmp_path):
    rows = read_rows(write_jsonl(tmp_path / "chat.jsonl", CHAT))
    # before: "missing field 'prompt'"
    assert rows[0] == {"prompt": "1+1=", "answer": "2", "messages": CHAT[0]["messages"][:2]}
    assert rows[1] == {"prompt": "2+2=", "answer": "4", "level": 1, "messages": CHAT[1]["messages"]}
    # an answer field stays the reference; the assistant turn is the row's target (sft.target=target)
    assert rows[2] == {"prompt": "3+3=", "answer": "6", "target": "It is 6", "messages": CHAT[2]["messages"][:1]}
    # the last user turn is the prompt, the turns before it stay in the conversation
    assert rows[3] == {"prompt": "4+4=", "answer": "8", "messages": CHAT[3]["messages"][:3]}


@pytest.mark.parametrize("row, why", [
    ({"messages": []}, "field 'messages' must be a non-empty list"),
    ({"messages": [{"role": "user"}]}, "messages[0] must be an object with string 'role' and 'content'"),
    ({"messages": [{"role": "system", "content": "x"}], "answer": "1"}, "messages has no user turn"),
    ({"messages": [{"role": "user", "content": "q"}]}, "missing field 'answer' (a chat row takes it from"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                   {"role": "assistant", "content": "b"}]}, "after the last user turn, messages may hold one"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]}, "field 'answer' is empty"),
    ({"prompt": "q", "messages": [{"role": "user", "content": "q"}], "answer": "1"}, "either 'prompt' or 'messages'"),
])
def test_bad_chat_rows_are_file_line_errors(tmp_path, row, why):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"prompt": "ok", "answer": "1"}, row])
    with pytest.raises(ValueError) as err:
        read_rows(path)
    assert str(err.value).startswith(f"{path}:2: ") and why in str(err.value)


def test_chat_rows_with_the_tiny_model_are_a_one_line_error(tmp_path, capsys, tiny_policy):
    data = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    with pytest.raises(ValueError) as err:
        tasks.check_task_for_policy(load(f"jsonl:{data}"), tiny_policy)
    assert str(err.value) == (
        f"task jsonl:{data}: {data}:1 is a chat row ('messages'), which needs the model's chat template, and this "
        "model's tokenizer has none (the tiny model has none): use a chat model, or write the rows as "
        '{"prompt": ..., "answer": ...}')
    out = tmp_path / "run"
    assert main(["train", "--no-progress", "--task", f"jsonl:{data}", "--out", str(out), *SMALL_RL,
                 *TINY_OVERRIDES]) == 2
    assert _err_line(capsys) == f"rewardlab train: error: {err.value}" and not out.exists()
    with pytest.raises(ValueError, match="chat rows \\('messages'\\) need the model's chat template"):
        tiny_policy.generate(["1+1="], rows=[load(f"jsonl:{data}").train[0]], greedy=True)  # any verb


@pytest.fixture
def chat_model_dir(tmp_path):
    """The tiny model saved as a Hugging Face model directory whose tokenizer has a chat template."""
    from rewardlab.policy.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    path = tmp_path / "chat-model"
    build_model(tokenizer, seed=0, **TINY_ARCH).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_chat_model_formats_the_whole_conversation(tmp_path, chat_model_dir):
    from rewardlab.policy import load_policy

    policy = load_policy(str(chat_model_dir))
    task = load(f"jsonl:{write_jsonl(tmp_path / 'chat.jsonl', CHAT)}", test_size=0)
    tasks.check_task_for_policy(task, policy)
    rows = sorted(task.train, key=lambda r: r["prompt"])
    rollouts = policy.generate([r["prompt"] for r in rows], rows=rows, greedy=True, max_new_tokens=1)
    assert [r.prompt for r in rollouts] == [
        "<|system|>Be brief.\n<|user|>1+1=\n<|assistant|>",
        "<|user|>2+2=\n<|assistant|>",
        "<|user|>3+3=\n<|assistant|>",
        "<|user|>hi\n<|assistant|>hello\n<|user|>4+4=\n<|assistant|>",
    ]
    # a prompt that is not the row's last user turn (e.g. a search prefix added to it) stays one user turn
    assert policy.format_prompt("x", rows[0]["messages"]) == "<|user|>x\n<|assistant|>"
    raw = load_policy(str(chat_model_dir), prompt_format="raw")
    with pytest.raises(ValueError, match=r"is a chat row \('messages'\), which needs the model's chat template; "
                                         r"model.prompt_format is 'raw': set it to chat \(or auto\)$"):
        tasks.check_task_for_policy(task, raw)


def test_sft_and_train_run_on_chat_rows_with_a_chat_model(tmp_path, capsys, chat_model_dir):
    data = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    assert main(["sft", "--model", str(chat_model_dir), "--task", f"jsonl:{data}", "--out", str(tmp_path / "sft"),
                 "sft.steps=1", "sft.batch_size=2", "task.options={test_size: 1}"]) == 0
    assert f"task jsonl:{data}: trains on 3 rows and holds out 1, both from {data}" in capsys.readouterr().err
    assert main(["train", "--no-progress", "--model", str(chat_model_dir), "--task", f"jsonl:{data}", "--out",
                 str(tmp_path / "rl"), "task.options={test_size: 1}", *SMALL_RL]) == 0
    samples = [json.loads(line) for line in (tmp_path / "rl" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and {s["prompt"] for s in samples} <= {"1+1=", "2+2=", "3+3=", "4+4="}


# ---------------------------------------------------------------- task options and the task summary
def test_the_task_file_as_its_own_test_path_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(3)])
    with pytest.raises(ValueError) as err:
        load(f"jsonl:{path}", test_path=f"{tmp_path}/./d.jsonl")  # another spelling of the same file
    # before: "task.test_size: 0 test rows leave no training rows out of 0 unique questions"
    assert str(err.value) == (f"task.options.test_path: {tmp_path}/./d.jsonl is the task file itself; give a "
                              "separate file of held-out rows, or leave test_path out to hold out "
                              f"task.options.test_size (default 0.1) of {path}")
    other = write_jsonl(tmp_path / "t.jsonl", [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in (2, 1, 0)])
    with pytest.raises(ValueError, match=r"^task.options.test_path: every question of .*d.jsonl \(3\) is also in "):
        load(f"jsonl:{path}", test_path=str(other))


@pytest.mark.parametrize("options, message", [
    ({"test_path": 5}, "task.options.test_path: expected the path of a JSONL file, got 5"),
    ({"test_path": "t.jsonl", "test_size": 2}, "task.options: test_size and test_path exclude each other"),
    ({"seed": "x"}, "task.options.seed: expected an integer, got 'x'"),
    ({"test_size": "abc"}, "task.options.test_size: expected a count of test rows"),
    ({"reward": "exact"}, "task.options.reward: unknown reward 'exact'; valid: "),
    ({"tset_size": 60}, "task.options: unknown option 'tset_size' for task kind 'jsonl'; valid: reward, seed, "
                        "test_path, test_size"),
])
def test_jsonl_options_are_one_line_errors_naming_the_option(tmp_path, options, message):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(3)])
    with pytest.raises(ValueError) as err:
        load(f"jsonl:{path}", **options)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_missing_test_path_names_the_option(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    with pytest.raises(FileNotFoundError, match=r"^task.options.test_path: .*nope.jsonl: not found$"):
        load(f"jsonl:{path}", test_path=str(tmp_path / "nope.jsonl"))


def test_describe_task_says_what_is_trained_and_held_out_and_from_where(tmp_path):
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(20)]
    path = write_jsonl(tmp_path / "d.jsonl", rows + rows[:2])  # 22 lines, 20 unique prompts
    assert tasks.describe_task(load(f"jsonl:{path}")) == (
        f"task jsonl:{path}: trains on 18 rows and holds out 2, both from {path} (22 rows, 20 unique; the 2 held "
        "out are task.options.test_size=0.1 of its unique questions, split seed 0)")
    test = write_jsonl(tmp_path / "t.jsonl", rows[:3] + [{"prompt": "x", "answer": "y"}])
    assert tasks.describe_task(load(f"jsonl:{path}", test_path=str(test))) == (
        f"task jsonl:{path}: trains on 17 rows and holds out 4, from {path} (22 rows, 20 unique; 3 dropped because "
        f"{test} holds them); the held-out rows are task.options.test_path {test} (4 rows)")
    gym = load("reasoning_gym:chain_sum", size=30, test_size=5, seed=0, min_terms=2, max_terms=2, max_digits=1)
    assert tasks.describe_task(gym) == (
        f"task reasoning_gym:chain_sum: trains on {len(gym.train)} rows and holds out 5, generated by reasoning-gym "
        f"(task.options.size=30 draws, seed 0: {len(gym.train) + 5} unique questions; the 5 held out are "
        "task.options.test_size=5 of them)")


def test_a_spec_without_a_kind_shows_every_kind():
    with pytest.raises(ValueError) as err:
        load("foo")
    # before: only "e.g. 'reasoning_gym:chain_sum'"
    assert str(err.value) == ("task spec 'foo': expected 'kind:argument', one of: jsonl:PATH, reasoning_gym:NAME "
                              "(e.g. reasoning_gym:chain_sum), humaneval[:FILE], worked:NAME, env:NAME")
