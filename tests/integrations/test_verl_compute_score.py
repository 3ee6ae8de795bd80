"""rewardlab rewards as verl's custom reward function (`compute_score`) and its batch form. These need no verl:
they call the functions as verl's reward managers do (keywords data_source, solution_str, ground_truth,
extra_info; the batch manager's lists)."""

import json

import pytest

from rewardlab.integrations import verl as rv
from rewardlab.integrations.common import as_reward
from rewardlab.rewards import RewardError, reward


def test_extra_info_names_the_reward_and_ground_truth_is_the_answer():
    got = rv.compute_score(data_source="anything", solution_str="<answer>4</answer>", ground_truth="4",
                           extra_info={"reward": "exact_match", "split": "train", "index": 3})
    assert got == {"score": 1.0, "exact_match": 1.0, "error": 0.0}


def test_data_source_table_picks_the_reward():
    assert rv.DATA_SOURCES["openai/gsm8k"] == "numeric"
    got = rv.compute_score("openai/gsm8k", "so the total is 72 dollars", "72", {"split": "test"})
    assert got == {"score": 1.0, "numeric": 1.0, "error": 0.0}
    assert rv.compute_score("openai/gsm8k", "it is 70", "72")["score"] == 0.0


def test_a_spec_in_extra_info_gives_the_same_keys_for_every_sample():
    spec = {"compose": "gated", "gate": "exact_match", "reward": {"shape": "length", "reward": "numeric",
                                                                   "coef": 0.0}}
    open_ = rv.compute_score("x", "4", "4", {"reward": spec})
    closed = rv.compute_score("x", "5", "4", {"reward": spec})
    assert list(open_) == list(closed) == ["score", "gated", "exact_match", "numeric", "numeric/unshaped",
                                           "numeric/length_penalty", "gate_open", "error"]
    assert (open_["score"], open_["gate_open"], closed["score"], closed["gate_open"]) == (1.0, 1.0, 0.0, 0.0)
    assert closed["numeric"] == 0.0  # not scored behind a closed gate: 0.0 keeps verl's per-key stacks aligned


def test_bad_input_is_one_line_listing_the_valid_names():
    with pytest.raises(ValueError, match=r"^data_source 'mystery' has no rewardlab reward: name one in "
                                         r"extra_info\['reward'\] or use a data_source of .*openai/gsm8k"):
        rv.compute_score("mystery", "4", "4", {})
    with pytest.raises(ValueError, match=r"^extra_info\['reward'\]: .*unknown reward 'nope'.*exact_match"):
        rv.compute_score("x", "4", "4", {"reward": "nope"})
    with pytest.raises(ValueError, match="on_error: expected raise or zero"):
        rv.compute_score("x", "4", "4", {"reward": "exact_match"}, on_error="skip")


@pytest.fixture
def fake(monkeypatch):
    """A reward registered in the adapter's cache under the name "probe": records its batches and row fields."""
    calls = []

    @reward(name="probe", register=False)
    def probe(completion, row):
        calls.append((completion, dict(row)))
        if completion == "boom":
            raise RuntimeError("exploded")
        return float(len(completion))

    built = as_reward(probe(), on_error="zero")
    monkeypatch.setitem(rv._BUILT, json.dumps("probe"), (built, ["probe"]))
    return calls


def test_extra_info_entries_are_row_fields_and_verls_own_are_not(fake):
    info = {"reward": "probe", "level": 2, "rollout_reward_scores": {}, "num_turns": 1}
    assert rv.compute_score("x", "abc", "gt", info) == {"score": 3.0, "probe": 3.0, "error": 0.0}
    assert fake[0][1] == {"level": 2, "answer": "gt"}


def test_on_error_zero_marks_the_error_and_raise_raises(fake):
    assert rv.compute_score("x", "boom", None, {"reward": "probe"}) == {"score": 0.0, "probe": 0.0, "error": 1.0}
    with pytest.raises(RewardError, match="probe: RuntimeError: exploded"):
        rv.compute_score("x", "boom", None, {"reward": "probe"}, on_error="raise")


def test_batch_form_scores_each_reward_once_and_keeps_the_order(fake):
    got = rv.compute_score_batch(
        data_sources=["x", "openai/gsm8k", "x"], solution_strs=["ab", "72", "abcd"], ground_truths=[None, "72", None],
        extra_infos=[{"reward": "probe"}, {}, {"reward": "probe"}])
    assert got == [{"score": 2.0, "probe": 2.0, "error": 0.0}, {"score": 1.0, "numeric": 1.0, "error": 0.0},
                   {"score": 4.0, "probe": 4.0, "error": 0.0}]
    assert [c for c, _ in fake] == ["ab", "abcd"]  # one call of the probe reward for both of its samples
    with pytest.raises(ValueError, match="compute_score_batch: 1 data_sources, 2 solution_strs"):
        rv.compute_score_batch(["x"], ["a", "b"], [None, None], [{}, {}])


def test_threads_of_verls_reward_loop_build_a_reward_once(monkeypatch):
    """verl's reward loop calls compute_score from executor threads; the first calls of a new spec race."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    builds = []
    real = rv.as_reward

    def slow_build(spec, *, on_error):
        builds.append(spec)
        time.sleep(0.05)  # widen the window in which a second thread could start its own build
        return real(spec, on_error=on_error)

    monkeypatch.setattr(rv, "as_reward", slow_build)
    monkeypatch.setattr(rv, "_BUILT", {})
    with ThreadPoolExecutor(max_workers=6) as pool:
        got = list(pool.map(lambda _: rv.compute_score("x", "4", "4", {"reward": "exact_match"}), range(6)))
    assert builds == ["exact_match"]
    assert [g["score"] for g in got] == [1.0] * 6
