"""The reward contract: argument injection, errors, the registry, weighted sums and the built-in verifiers."""

import math

import pytest

from conftest import make_rollout
from rewardlab.rewards import REWARDS, FunctionReward, Reward, RewardError, WeightedSum, build_reward, reward
from rewardlab.rewards.compose import GatedReward
from rewardlab.types import RewardOutput


# ---------------------------------------------------------------- argument injection
def test_function_receives_only_named_arguments():
    seen = []

    @reward(register=False)
    def match(completion, answer):
        seen.append((completion, answer))
        return float(completion == answer)

    outs = match()([make_rollout("7", {"prompt": "3+4=", "answer": "7"}), make_rollout("8", {"answer": "7"})])
    assert [o.score for o in outs] == [1.0, 0.0]
    assert seen == [("7", "7"), ("8", "7")]


def test_function_receives_task_field_and_prompt_from_row():
    @reward(register=False)
    def by_difficulty(prompt, difficulty):
        return {"score": difficulty / 10, "len": float(len(prompt))}

    row = {"prompt": "abc", "answer": "1", "difficulty": 3}
    (out,) = by_difficulty()([make_rollout("x", row, prompt="formatted prompt")])
    assert out.score == pytest.approx(0.3)  # 3 / 10
    assert out.components == {"len": 3.0}  # prompt is the task prompt "abc", not the formatted one
    # no row prompt: the rollout's own prompt
    (out,) = by_difficulty()([make_rollout("x", {"difficulty": 5}, prompt="formatted prompt")])
    assert out.components == {"len": float(len("formatted prompt"))}


def test_function_receives_steps_as_step_texts():
    @reward(register=False)
    def last_step(steps):
        return {"score": float(len(steps)), "last_len": float(len(steps[-1]))}

    r = make_rollout("ab\ncd", steps=[(0, 3), (3, 5)])
    r.step_text = ["ab\n", "cd"]
    (out,) = last_step()([r])
    assert out.score == 2.0 and out.components == {"last_len": 2.0}  # "cd" has 2 characters
    (out,) = last_step()([make_rollout("abcd")])  # no steps marked: an empty list, so steps[-1] fails explicitly
    assert out.error is not None and out.error.startswith("last_step: IndexError")


def test_options_are_passed_and_unknown_options_rejected():
    @reward(register=False)
    def scaled(completion, factor=1.0):
        return factor * len(completion)

    assert scaled(factor=0.5)([make_rollout("abcd")])[0].score == 2.0  # 0.5 * 4
    with pytest.raises(ValueError, match=r"reward scaled: unknown option\(s\) \['facter'\]"):
        scaled(facter=2)


def test_named_parameters_precedence_option_then_rollout_field_then_row_field_then_default():
    seen = []

    @reward(register=False)
    def probe(completion, answer, level, unit="m", tag="none"):
        seen.append((completion, answer, level, unit, tag))
        return 1.0

    # a row field named like a rollout field ("completion") loses to the rollout's; an option ("unit") wins over a
    # row field of the same name; a parameter nothing gives ("tag") keeps its default; no answer in the row: None
    probe(unit="cm")([make_rollout("7", {"completion": "row's", "unit": "km", "level": 3})])
    assert seen == [("7", None, 3, "cm", "none")]
    (out,) = probe()([make_rollout("7", {"answer": "7"})])  # level missing and without a default: an explicit error
    assert out.error is not None and out.error.startswith("probe: TypeError") and "level" in out.error


def test_var_keyword_function_gets_all_fields():
    @reward(register=False)
    def everything(**kw):
        return float({"completion", "answer", "prompt", "row", "rollout", "steps", "level"} <= set(kw))

    assert everything()([make_rollout("a", {"answer": "b", "level": 2})])[0].score == 1.0


def test_function_reward_is_a_reward():
    @reward(register=False)
    def r(completion):
        return 0.0

    built = r()
    assert isinstance(built, FunctionReward) and isinstance(built, Reward) and built.name == "r"


def test_return_types():
    @reward(register=False)
    def as_bool(completion):
        return completion == "y"

    @reward(register=False)
    def as_output(completion):
        return RewardOutput(score=0.25, components={"c": 1.0}, step_scores=[0.5])

    assert [o.score for o in as_bool()([make_rollout("y"), make_rollout("n")])] == [1.0, 0.0]
    (out,) = as_output()([make_rollout("y")])
    assert (out.score, out.components, out.step_scores) == (0.25, {"c": 1.0}, [0.5])


# ---------------------------------------------------------------- errors
def test_exception_becomes_error_naming_reward():
    @reward(name="boom", register=False)
    def boom(completion):
        raise KeyError("missing\nsecond line")

    (out,) = boom()([make_rollout("x")])
    assert out.score == 0.0
    assert out.error.startswith("boom: KeyError") and "\n" not in out.error


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_score_becomes_error(value):
    @reward(name="bad", register=False)
    def bad(completion):
        return value

    (out,) = bad()([make_rollout("x")])
    assert out.score == 0.0 and out.error == f"bad: score is {value}"  # e.g. "bad: score is nan"


def test_nan_in_dict_score_becomes_error():
    @reward(name="bad", register=False)
    def bad(completion):
        return {"score": math.nan, "c": 1.0}

    (out,) = bad()([make_rollout("x")])
    assert out.score == 0.0 and out.error == "bad: score is nan" and out.components == {"c": 1.0}


# ---------------------------------------------------------------- registry
def test_register_false_leaves_registry_unchanged():
    before = set(REWARDS)

    @reward(name="test_unregistered_reward", register=False)
    def r(completion):
        return 0.0

    assert set(REWARDS) == before


def test_registering_a_taken_name_fails():
    assert "exact_match" in REWARDS
    with pytest.raises(ValueError, match="already registered"):
        @reward(name="exact_match")
        def again(completion):
            return 0.0


def test_build_reward_unknown_name_lists_names():
    with pytest.raises(ValueError) as info:
        build_reward([{"name": "no_such_reward"}])
    msg = str(info.value)
    assert "rewards[0].name" in msg and "no_such_reward" in msg
    assert "exact_match" in msg and "reasoning_gym" in msg


def test_build_reward_unknown_option():
    with pytest.raises(ValueError, match=r"^rewards\[1\]: unknown option 'casee' for reward 'exact_match'; valid: "
                       r"answer, case, completion, .*workers$"):
        build_reward([{"name": "exact_match"}, {"name": "exact_match", "casee": False}])


def test_build_reward_missing_name():
    with pytest.raises(ValueError, match=r"rewards\[0\]: missing 'name'"):
        build_reward([{"weight": 1.0}])


def test_build_reward_from_string():
    built = build_reward("exact_match")
    assert isinstance(built, WeightedSum) and [w for _, w in built.members] == [1.0]
    (out,) = built([make_rollout("7", {"answer": "7"})])
    # one member: its own components keep their names, plus the member's score under its name.
    assert out.score == 1.0 and out.components == {"exact_match": 1.0, "correct": 1.0}


# ---------------------------------------------------------------- WeightedSum
@reward(register=False)
def _length(completion):
    return float(len(completion))


@reward(register=False)
def _parts(completion):
    return {"score": 2.0, "a": 1.0}


@reward(name="_fails", register=False)
def _fails(completion):
    if completion == "bad":
        raise RuntimeError("no")
    return 1.0


def test_weighted_sum_weights_and_components():
    ws = WeightedSum([(_length(), 1.0), (_parts(), 0.5)])
    (out,) = ws([make_rollout("abc")])
    assert out.score == pytest.approx(4.0)  # 1 * len("abc") + 0.5 * 2 = 3 + 1
    assert out.components == {"_length": 3.0, "_parts": 2.0, "_parts/a": 1.0}
    assert out.error is None


def test_weighted_sum_zero_weight_is_logged_only():
    ws = WeightedSum([(_length(), 0.0), (_parts(), 1.0)])
    (out,) = ws([make_rollout("abcd")])
    assert out.score == 2.0 and out.components["_length"] == 4.0  # 0 * 4 + 1 * 2


def test_weighted_sum_error_zero():
    ws = WeightedSum([(_length(), 1.0), (_fails(), 1.0)], on_error="zero")
    ok, bad = ws([make_rollout("ok"), make_rollout("bad")])
    assert ok.score == 3.0 and ok.error is None  # 2 + 1
    assert bad.score == 0.0 and bad.error.startswith("_fails: RuntimeError: no")
    assert bad.components["_length"] == 3.0  # the members' scores stay visible for logging


def test_weighted_sum_error_raise():
    ws = WeightedSum([(_fails(), 1.0)], on_error="raise")
    assert ws([make_rollout("ok")])[0].score == 1.0
    with pytest.raises(RewardError, match="_fails: RuntimeError: no"):
        ws([make_rollout("ok"), make_rollout("bad")])


def test_weighted_sum_rejects_unknown_on_error():
    with pytest.raises(ValueError, match="on_error"):
        WeightedSum([(_length(), 1.0)], on_error="ignore")


def test_build_reward_weights():
    built = build_reward([{"name": "exact_match"}, {"name": "exact_match", "weight": 0.5, "case": False}])
    (out,) = built([make_rollout("ABC", {"answer": "abc"})])
    assert out.score == 0.5  # 1 * 0 (case-sensitive) + 0.5 * 1 (case-insensitive)


# ---------------------------------------------------------------- registered verifiers
@pytest.mark.parametrize(
    "completion, answer, score",
    [
        ("7", "7", 1.0),
        (" 7\n", "7", 1.0),  # stripped
        ("8", "7", 0.0),
        ("work... <answer>7</answer>", "7", 1.0),
        ("<answer>3</answer> then <answer> 7 </answer>", "7", 1.0),  # the last tag wins
        ("<answer>8</answer>", "7", 0.0),
        ("", "7", 0.0),
    ],
)
def test_exact_match(completion, answer, score):
    (out,) = build_reward("exact_match")([make_rollout(completion, {"answer": answer})])
    assert out.score == score and out.components["correct"] == score


def test_exact_match_options():
    em = REWARDS["exact_match"]
    assert em(case=False)([make_rollout("Yes", {"answer": "yes"})])[0].score == 1.0
    assert em()([make_rollout("Yes", {"answer": "yes"})])[0].score == 0.0
    assert em(whitespace=False)([make_rollout("1 2", {"answer": "12"})])[0].score == 1.0


def test_reasoning_gym_reward(chain_sum_task):
    row = chain_sum_task.test[0]
    wrong = str(int(row["answer"]) + 1)
    rg = build_reward("reasoning_gym")
    right, tagged, bad = rg([make_rollout(row["answer"], row), make_rollout(f"<answer>{row['answer']}</answer>", row),
                             make_rollout(wrong, row)])
    assert right.score == 1.0 and right.components["correct"] == 1.0
    assert tagged.score == 1.0
    assert bad.score == 0.0 and bad.components == {"reasoning_gym": 0.0, "correct": 0.0, "partial": 0.0}


def test_reasoning_gym_reward_without_dataset_row_is_an_error():
    (out,) = build_reward("reasoning_gym")([make_rollout("7", {"answer": "7"})])
    assert out.score == 0.0 and out.error.startswith("reasoning_gym: KeyError")


def test_repeated_reward_names_get_distinct_components_and_correct_stays_top_level():
    built = build_reward([{"name": "exact_match"}, {"name": "exact_match", "weight": 0.5, "case": False}])
    (out,) = built([make_rollout("ABC", {"answer": "abc"})])
    # member 1 (case-sensitive) scores 0, member 2 (case-insensitive) scores 1; neither overwrites the other.
    assert out.components["exact_match"] == 0.0 and out.components["exact_match#2"] == 1.0
    assert out.components["exact_match/correct"] == 0.0 and out.components["exact_match#2/correct"] == 1.0
    assert out.components["correct"] == 0.0  # the first member that reports `correct`


# ---------------------------------------------------------------- non-finite outputs are reward errors
class _Fixed:
    """A Reward that returns given outputs as they are (like a model or judge reward building RewardOutput itself)."""

    def __init__(self, name, outputs):
        self.name, self.outputs = name, outputs

    def __call__(self, rollouts):
        return list(self.outputs[: len(rollouts)])


@pytest.mark.parametrize("bad, cause", [
    (RewardOutput(score=math.inf), "score is inf"),
    (RewardOutput(score=-math.inf), "score is -inf"),
    (RewardOutput(score=1.0, components={"ok": 2.0, "aux": math.nan}), "component 'aux' is nan"),
    (RewardOutput(score=1.0, step_scores=[0.5, math.nan]), "step_scores[1] is nan"),
])
def test_non_finite_member_output_is_a_reward_error(bad, cause):
    # Before: inf/NaN passed through WeightedSum and NaN'd the rollout's group (or the whole batch) in the estimator.
    member = _Fixed("prm", [RewardOutput(score=0.25, step_scores=[0.5, 0.5]), bad])
    rollouts = [make_rollout("a"), make_rollout("b")]
    for on_error in ("zero", "skip"):
        good, failed = WeightedSum([(member, 2.0), (_length(), 1.0)], on_error=on_error)(rollouts)
        assert good.error is None and good.score == 1.5  # 2 * .25 + 1
        assert failed.error == f"prm: {cause}" and failed.score == 0.0
        assert failed.components["_length"] == 1.0  # the finite members stay visible for logging
        assert all(math.isfinite(v) for v in failed.components.values()) and failed.step_scores is None
    with pytest.raises(RewardError, match=f"prm: {cause}".replace("[", r"\[")):
        WeightedSum([(member, 1.0)], on_error="raise")(rollouts)


def test_function_reward_nan_component_is_an_error_with_its_name():
    @reward(name="aux_nan", register=False)
    def aux_nan(completion):
        return {"score": 1.0, "aux": math.nan if completion == "bad" else 0.5}

    ok, bad = WeightedSum([(aux_nan(), 1.0)])([make_rollout("ok"), make_rollout("bad")])
    assert ok.error is None and ok.components == {"aux_nan": 1.0, "aux": 0.5}
    assert bad.error == "aux_nan: component 'aux' is nan" and bad.score == 0.0
    assert bad.components == {"aux_nan": 0.0}


def test_weighted_sum_overflow_is_an_error():
    big = _Fixed("big", [RewardOutput(score=1e308)])
    (out,) = WeightedSum([(big, 10.0)], name="reward")([make_rollout("a")])
    assert out.error == "reward: weighted score is inf" and out.score == 0.0
    # 1e309 - 1e309 = inf - inf = nan: an error too, not a RewardOutput that refuses a NaN score
    (out,) = WeightedSum([(big, 10.0), (big, -10.0)], name="reward")([make_rollout("a")])
    assert out.error == "reward: weighted score is nan" and out.score == 0.0


def test_non_finite_inside_a_composition_is_caught_at_the_top():
    # a gated node forwards its inner reward's step scores; a NaN among them is an error of the top-level member
    gate = _Fixed("gate", [RewardOutput(score=1.0)])
    inner = _Fixed("prm", [RewardOutput(score=0.5, step_scores=[math.nan])])
    (out,) = WeightedSum([(GatedReward(gate, inner, name="gated"), 1.0)])([make_rollout("a", steps=[(0, 1)])])
    assert out.error == "gated: step_scores[0] is nan" and out.score == 0.0
