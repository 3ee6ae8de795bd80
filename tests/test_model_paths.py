"""A model path that does not exist, is not a model directory, or does not load: one line naming its config key,
from every verb and loader that takes one, before any run directory is created and without reaching the hub."""

import pytest

from conftest import TINY_ARCH, TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.modeldir import check_model_dir


def _stderr_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _verb_args(verb: str, tmp_path) -> list[str]:
    if verb == "rm train":
        pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}])
        return ["rm", "train", "--data", str(pairs)]
    rows = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(4)])
    return [verb, "--task", f"jsonl:{rows}", *TINY_OVERRIDES]


VERBS = ["train", "evaluate", "sft", "rm train"]


@pytest.mark.parametrize("verb", VERBS)
def test_missing_model_path_is_one_line(verb, tmp_path, capsys):
    out = tmp_path / "run"
    missing = tmp_path / "nonexistent"
    assert main([*_verb_args(verb, tmp_path), "--no-progress", "--out", str(out), "--model", str(missing)]) == 2
    assert _stderr_line(capsys) == f"rewardlab {verb}: error: model.path: {missing} does not exist"
    assert not out.exists()


@pytest.mark.parametrize("verb", VERBS)
def test_directory_without_config_is_one_line(verb, tmp_path, capsys):
    out = tmp_path / "run"
    not_model = tmp_path / "notes"
    not_model.mkdir()
    (not_model / "readme.txt").write_text("not a model")
    assert main([*_verb_args(verb, tmp_path), "--no-progress", "--out", str(out), "--model", str(not_model)]) == 2
    if verb == "rm train":  # a backbone is a full model
        want = "has no config.json (not a Hugging Face model directory)"
    else:  # a policy may be a LoRA checkpoint too
        want = "has no config.json or adapter_config.json (not a Hugging Face model or LoRA adapter directory)"
    assert _stderr_line(capsys) == f"rewardlab {verb}: error: model.path: {not_model} {want}"
    assert not out.exists()


@pytest.mark.parametrize("verb", ["train", "rm train"])
def test_hub_id_is_not_downloaded(verb, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "org/name" is not a directory here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main([*_verb_args(verb, tmp_path), "--no-progress", "--out", str(tmp_path / "run"),
                 "--model", "Qwen/Qwen2.5-0.5B"]) == 2
    line = _stderr_line(capsys)
    assert line.startswith(f"rewardlab {verb}: error: model.path: Qwen/Qwen2.5-0.5B does not exist (hub ids are not "
                           "downloaded at run time")
    assert "hf download Qwen/Qwen2.5-0.5B --local-dir DIR" in line


def test_broken_model_directories_name_the_key(tmp_path):
    from rewardlab.policy import load_policy

    good = tmp_path / "good"
    load_policy("tiny", tiny_arch=TINY_ARCH).save(good)
    assert load_policy(str(good)).tokenizer is not None  # the intact copy loads

    def broken(name: str, mutate) -> str:
        d = tmp_path / name
        d.mkdir()
        for f in good.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        mutate(d)
        with pytest.raises(ValueError) as info:
            load_policy(str(d))
        assert "\n" not in str(info.value)
        return str(info.value)

    msg = broken("no_tokenizer", lambda d: [f.unlink() for f in d.iterdir() if f.name.startswith("tokenizer")])
    assert msg.startswith(f"model.path: {tmp_path / 'no_tokenizer'} has no tokenizer files")
    msg = broken("truncated", lambda d: (d / "model.safetensors").write_bytes(b""))
    assert msg.startswith(f"model.path: cannot load the model in {tmp_path / 'truncated'} (SafetensorError")
    msg = broken("no_weights", lambda d: (d / "model.safetensors").unlink())
    assert msg.startswith(f"model.path: cannot load the model in {tmp_path / 'no_weights'} (OSError")


def test_a_file_is_not_a_model_directory(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"\0")
    with pytest.raises(ValueError, match=r"^model\.path: .*model\.bin is not a directory"):
        check_model_dir(f)
    with pytest.raises(ValueError, match=r"^model\.path: empty path"):
        check_model_dir("")


def test_scorer_paths_name_their_option(tmp_path, capsys):
    from rewardlab.rewards import build_reward

    missing = tmp_path / "rm"
    with pytest.raises(ValueError) as info:
        build_reward([{"name": "reward_model", "path": str(missing)}])
    assert str(info.value) == f"rewards[0] (reward_model): reward_model.path: {missing} does not exist"
    with pytest.raises(ValueError) as info:
        build_reward([{"name": "process_reward_model", "path": str(tmp_path)}])
    assert str(info.value) == (f"rewards[0] (process_reward_model): process_reward_model.path: {tmp_path} "
                               "has no config.json (not a Hugging Face model directory)")
    # `rm eval --model` names the verb's key
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}])
    assert main(["rm", "eval", "--no-progress", "--data", str(pairs), "--out", str(tmp_path / "ev"),
                 "--model", str(missing)]) == 2
    assert _stderr_line(capsys) == f"rewardlab rm eval: error: model.path: {missing} does not exist"


def test_a_loaded_model_computes_what_the_model_that_saved_it_computes(tmp_path):
    """Weights read from safetensors sit at arbitrary offsets; the CPU's matrix kernels round differently at other
    alignments, so `load_pretrained` gives every tensor aligned storage of its own (tied weights stay tied)."""
    import torch

    from rewardlab.modeldir import load_pretrained
    from rewardlab.policy import load_policy
    from transformers import AutoModelForCausalLM

    from conftest import TINY_ARCH

    built = load_policy("tiny", tiny_arch=TINY_ARCH)  # its safetensors put the tensors 24 bytes off a boundary
    built.save(tmp_path / "m")
    model = load_pretrained(AutoModelForCausalLM, tmp_path / "m")
    assert all(p.data_ptr() % 64 == 0 for p in model.parameters())
    assert model.lm_head.weight is model.get_input_embeddings().weight  # still tied
    ids = torch.randint(0, 101, (7, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, built.model(input_ids=ids).logits)
    # (unaligned, the episode sampler's one-token decoding steps rounded differently: a run resumed from a
    # checkpoint drifted from the uninterrupted one, tests/rl/test_trainer_episodes.py)
