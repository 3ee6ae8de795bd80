"""rewardlab rewards as TRL reward functions: the call TRL's GRPOTrainer makes (prompts, completions,
completion_ids and the dataset columns plus trainer_state / log_extra / log_metric / environments as keywords)."""

import math

import pytest

from rewardlab.integrations.trl import PEER_KWARGS, as_trl_reward_func, as_trl_reward_funcs
from rewardlab.rewards import RewardError, build_reward, reward
from rewardlab.types import Rollout

PEERS = {"trainer_state": object(), "log_extra": lambda column, values: None, "log_metric": lambda name, v: None,
         "environments": [object(), object()]}


def weighted(funcs, weights, *args, **kwargs):
    """What GRPOTrainer trains on: per row, nansum over functions of weight x value (None -> NaN)."""
    cols = [f(*args, **kwargs) for f in funcs]
    return [sum(w * v for w, v in zip(weights, row) if v is not None and not math.isnan(w * v))
            for row in zip(*cols)]


def test_plain_completions_score_against_the_answer_column():
    f = as_trl_reward_func("exact_match")
    got = f(["2+2?", "2+2?"], ["<answer>4</answer>", "<answer>5</answer>"], [[1, 2], [3]], answer=["4", "4"], **PEERS)
    assert got == [1.0, 0.0]


def test_conversational_prompt_and_completion():
    seen = []

    @reward(name="echo_prompt", register=False)
    def echo(prompt, completion, row):
        seen.append((prompt, completion, row["messages"][-1]["content"]))
        return float(completion == "<answer>4</answer>")

    f = as_trl_reward_func(echo())
    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    got = f([prompt], [[{"role": "assistant", "content": "<answer>4</answer>"}]], [[7, 8]], **PEERS)
    assert got == [1.0]
    assert seen == [("2+2?", "<answer>4</answer>", "2+2?")]


def test_peer_keywords_are_filtered_and_columns_become_row_fields():
    rows = []

    @reward(name="by_difficulty", register=False)
    def by_difficulty(completion, difficulty, row):
        rows.append(dict(row))
        return difficulty * len(completion)

    f = as_trl_reward_func(by_difficulty())
    assert f(["p", "p"], ["ab", "abc"], [[1, 2], [1, 2, 3]], difficulty=[2, 10], **PEERS) == [4.0, 30.0]
    assert sorted(rows[0]) == ["difficulty", "prompt"]
    assert not set(PEER_KWARGS) & set(rows[1])


def test_an_unknown_column_reaches_rewardlab_so_a_strict_reward_sees_it():
    @reward(name="takes_all", register=False)
    def takes_all(completion, **fields):
        return float(fields["extra_column"])

    f = as_trl_reward_func(takes_all())
    assert f(["p"], ["c"], [[1]], extra_column=[3.5], **PEERS) == [3.5]


def test_funcs_compose_to_rewardlab_score_and_log_each_component():
    spec = [{"name": "exact_match"}, {"name": "numeric", "weight": 0.5}]
    funcs, weights = as_trl_reward_funcs(spec)
    assert [f.__name__ for f in funcs] == ["rewardlab", "rewardlab/exact_match", "rewardlab/numeric"]
    assert weights == [1.0, 0.0, 0.0]
    prompts, comps, ids = ["q", "q", "r"], ["<answer>4</answer>", "4.0", "7"], [[1], [2], [3]]
    cols = [f(prompts, comps, ids, answer=["4", "4", "3"], **PEERS) for f in funcs]
    # exact_match: 1, 0 ("4.0" != "4"), 0; numeric: 1, 1, 0 -> score 1 + 0.5, 0 + 0.5, 0
    assert cols == [[1.5, 0.5, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    rollouts = [Rollout(prompt=p, prompt_ids=[], completion=c, completion_ids=i, logprobs=[0.0] * len(i),
                        row={"answer": a}) for p, c, i, a in zip(prompts, comps, ids, ["4", "4", "3"])]
    assert weighted(funcs, weights, prompts, comps, ids, answer=["4", "4", "3"], **PEERS) == \
        [o.score for o in build_reward(spec)(rollouts)]


def test_non_linear_composition_gated_with_length_shaping():
    spec = {"compose": "gated", "gate": "exact_match",
            "reward": {"shape": "length", "reward": "numeric", "coef": 0.1}}
    funcs, weights = as_trl_reward_funcs(spec)
    names = [f.__name__ for f in funcs]
    assert len(set(names)) == len(names)
    prompts, comps, ids = ["q", "q"], ["4", "5"], [[1, 2], [3]]
    got = dict(zip(names, (f(prompts, comps, ids, answer=["4", "4"], **PEERS) for f in funcs)))
    # row 0: gate open, numeric 1 - 0.1 * 2 tokens = 0.8; row 1: gate closed -> 0, the shaped reward not scored
    assert got["rewardlab"] == pytest.approx([0.8, 0.0])
    assert got["rewardlab/gate_open"] == [1.0, 0.0]
    assert got["rewardlab/numeric/length_penalty"][0] == pytest.approx(-0.2)
    assert got["rewardlab/numeric/length_penalty"][1] is None  # not scored on a closed gate: not applicable
    assert weighted(funcs, weights, prompts, comps, ids, answer=["4", "4"]) == pytest.approx([0.8, 0.0])


def test_the_reward_is_scored_once_per_batch():
    calls = []

    @reward(name="counted", register=False)
    def counted(completion):
        calls.append(completion)
        return 1.0

    funcs, _ = as_trl_reward_funcs(counted())
    assert len(funcs) == 2
    batch = (["p", "p"], ["a", "b"], [[1], [2]])
    for f in funcs:
        assert f(*batch, **PEERS) == [1.0, 1.0]
    assert calls == ["a", "b"]
    funcs[0](["p", "p"], ["a", "b"], [[1], [2]], **PEERS)  # a new batch (new lists) is scored again
    assert calls == ["a", "b", "a", "b"]


@pytest.fixture
def flaky():
    @reward(name="flaky", register=False)
    def flaky(completion):
        if completion == "boom":
            raise RuntimeError("exploded")
        return 2.0

    return flaky


def test_on_error_raise(flaky):
    f = as_trl_reward_func(flaky(), on_error="raise")
    with pytest.raises(RewardError, match="rewardlab: flaky: RuntimeError: exploded"):
        f(["p", "p"], ["ok", "boom"], [[1], [2]], **PEERS)


@pytest.mark.parametrize("on_error,expected", [("skip", [2.0, None]), ("zero", [2.0, 0.0])])
def test_on_error_skip_and_zero_count_failures_through_log_metric(flaky, on_error, expected):
    logged = []
    funcs, _ = as_trl_reward_funcs(flaky(), on_error=on_error)
    peers = dict(PEERS, log_metric=lambda name, value: logged.append((name, value)))
    assert funcs[0](["p", "p"], ["ok", "boom"], [[1], [2]], **peers) == expected
    assert funcs[1](["p", "p"], ["ok", "boom"], [[1], [2]], **peers) == [2.0, None]  # the component: n/a
    assert logged == [("rewardlab/errors", 1.0), ("rewardlab/errors/flaky", 1.0)]
    assert funcs[0].failed == 1


def test_a_none_field_is_not_applicable():
    f = as_trl_reward_func("exact_match")
    assert f(["p", "q"], ["4", "4"], [[1], [2]], answer=[None, "4"], **PEERS) == [None, 1.0]


def test_a_needed_column_the_dataset_lacks_is_one_line_at_the_first_call():
    f = as_trl_reward_func([{"name": "exact_match"}, {"name": "math"}])
    with pytest.raises(ValueError, match=r"^rewardlab: the reward needs dataset column 'answer', which this dataset "
                                         r"lacks \(columns: level\)$"):
        f(["p"], ["4"], [[1]], level=[3], **PEERS)


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="on_error: expected one of raise, skip, zero, got 'ignore'"):
        as_trl_reward_func("exact_match", on_error="ignore")
    with pytest.raises(ValueError, match="unknown reward 'no_such'.*exact_match"):
        as_trl_reward_func("no_such")
    f = as_trl_reward_func("exact_match")
    with pytest.raises(ValueError, match="keyword 'answer' is not a dataset column of one value per completion "
                                         r"\(1 values for 2 completions\)"):
        f(["p", "p"], ["4", "4"], [[1], [2]], answer=["4"], **PEERS)
    with pytest.raises(ValueError, match="components: repeated"):
        as_trl_reward_funcs("exact_match", components=["a", "a"])


def test_episodes_handed_over_by_the_rollout_func_are_scored_themselves():
    from rewardlab.integrations.trl import ROLLOUT_COLUMN

    episode = Rollout(prompt="p", prompt_ids=[1], completion="<answer>4</answer>", completion_ids=[5, 6, 7],
                      logprobs=[-0.1, 0.0, -0.2], loss_mask=[1, 0, 1], row={"prompt": "p", "answer": "4"})
    f = as_trl_reward_func("exact_match")
    # TRL's decoded text (all turns) would not match; the episode's final model turn does
    assert f(["p"], ["<o>higher</o><answer>4</answer> more"], [[5, 6, 7]], **{ROLLOUT_COLUMN: [episode]},
             **PEERS) == [1.0]
    with pytest.raises(ValueError, match="column 'rewardlab_rollout' must hold one rewardlab Rollout per completion"):
        f(["p"], ["x"], [[1]], **{ROLLOUT_COLUMN: ["not a rollout"]}, **PEERS)


def test_failures_are_counted_once_per_batch_whichever_function_runs_first(flaky):
    logged = []
    funcs, _ = as_trl_reward_funcs(flaky(), on_error="zero")
    peers = dict(PEERS, log_metric=lambda name, value: logged.append((name, value)))
    batch = (["p", "p"], ["boom", "boom"], [[1], [2]])
    funcs[1](*batch, **peers)  # a component function scores the batch first
    funcs[0](*batch, **peers)
    funcs[0](*batch, **peers)  # the same batch again: not counted twice
    assert logged == [("rewardlab/errors", 2.0), ("rewardlab/errors/flaky", 2.0)]
    assert funcs[0].failed == 2


def test_an_environment_reward_names_the_column_a_prompt_answer_dataset_lacks():
    """calculator's reward (reasoning_gym) reads the row's dataset, question and metadata: on prompt/answer columns
    it used to fail on every row (KeyError 'dataset', seen only with on_error="raise"); the first call names it."""
    from rewardlab.envs import make_env

    env = make_env("calculator")
    rows = env.rows("train", 2)
    funcs, _ = as_trl_reward_funcs(env.reward)
    with pytest.raises(ValueError, match=r"^rewardlab: the reward needs dataset column 'dataset', which this "
                                         r"dataset lacks \(columns: answer\)$"):
        funcs[0]([r["prompt"] for r in rows], ["1", "2"], [[1], [2]], answer=[r["answer"] for r in rows], **PEERS)
    # the rows' own columns, and only the declared ones, are enough: it scores
    funcs, _ = as_trl_reward_funcs(env.reward, on_error="raise")
    cols = {k: [r[k] for r in rows] for k in ("dataset", "question", "answer", "metadata")}
    got = funcs[0]([r["prompt"] for r in rows], [f"<answer>{rows[0]['answer']}</answer>", "no"], [[1], [2]],
                   **cols, **PEERS)
    assert got == [1.0, 0.0]


def test_a_composed_reward_needs_the_union_and_alternatives_are_named_together():
    from rewardlab.integrations.common import needed_fields

    composed = build_reward([{"name": "reasoning_gym"},
                             {"compose": "gated", "gate": "exact_match", "reward": "arithmetic_steps"}])
    assert needed_fields(composed) == ["answer", "dataset", ("expression", "metadata"), "metadata", "question"]
    f = as_trl_reward_func("arithmetic_steps")
    with pytest.raises(ValueError, match=r"needs dataset column 'expression' or 'metadata', which this dataset "
                                         r"lacks \(columns: answer\)$"):
        f(["1+2="], ["1+2=3"], [[1]], answer=["3"], **PEERS)
    f = as_trl_reward_func("arithmetic_steps")  # either alternative is enough
    assert f(["1+2="], ["1+2=3"], [[1]], answer=["3"], metadata=[{"expression": "1 + 2"}], **PEERS) == [1.0]


def test_every_registered_reward_declares_the_row_fields_it_needs():
    """Walks rewardlab's own rewards: each declares `row_fields` (a function's are its signature's plus what it
    declares; one that reads the whole `row` or `**kwargs` must declare them), and every environment's rows hold
    the fields its reward needs (so `as_trl_rollout_func` episodes always carry them)."""
    import inspect

    import rewardlab.envs  # noqa: F401 - registers guess_found
    from rewardlab.envs import ENVIRONMENTS, make_env
    from rewardlab.integrations.common import needed_fields, row_field_names
    from rewardlab.rewards import REWARDS
    from rewardlab.rewards.base import check_row_fields

    declared = {}
    for name in sorted(REWARDS):
        factory = REWARDS[name]
        if not factory.__module__.startswith("rewardlab."):
            continue  # registered by another test of the session (the registry is process-wide)
        assert hasattr(factory, "row_fields"), name
        if hasattr(factory, "fn"):
            params = inspect.signature(factory.fn).parameters
            if "row" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
                assert factory.declared_row_fields is not None, f"{name} reads the row but declares no row_fields"
            declared[name] = factory.row_fields
            assert factory().row_fields == factory.row_fields, name
    assert declared == {
        "arithmetic_steps": ("answer", ("expression", "metadata")), "bleu": ("answer",), "chrf": ("answer",),
        "exact_match": ("answer",), "guess_found": ("answer",), "numeric": ("answer",),
        "reasoning_gym": ("dataset", "question", "answer", "metadata"), "rouge_l": ("answer",),
        "token_f1": ("answer",), "worked_answer": (("final", "answer"),),
    }
    from rewardlab.rewards.judge import Judge

    built = {"math": REWARDS["math"](), "code": REWARDS["code"](), "sql": REWARDS["sql"](),
             "sql_db": REWARDS["sql"](db_path="x.db"), "format": REWARDS["format"](),
             "judge": Judge(base_url="http://127.0.0.1:9", model="m", template="score_reference"),
             "pairwise": Judge(base_url="http://127.0.0.1:9", model="m", mode="pairwise", reference_field="ref")}
    assert {k: check_row_fields(k, v.row_fields) for k, v in built.items()} == {
        "math": ("answer",), "code": (("tests", "test"),), "sql": ("answer", "db_path"), "sql_db": ("answer",),
        "format": (), "judge": ("answer",), "pairwise": ("ref",)}
    for cls in ("reward_model", "process_reward_model"):
        assert REWARDS[cls].row_fields == ()
    for name in sorted(ENVIRONMENTS):
        if not ENVIRONMENTS[name].__module__.startswith("rewardlab."):
            continue  # a user's environment registered by another test of the session
        env = make_env(name)
        row = env.rows("train", 1)[0]
        needed = needed_fields(build_reward({"name": env.reward, **env.reward_options}))
        assert needed and all(any(a in row for a in row_field_names(f)) for f in needed), (name, needed)
