"""Automatic step labels: Monte Carlo values and binary search on chain sums with known step correctness."""

import pytest

from rewardlab.rewards import build_reward
from rewardlab.rm.labels import (
    PrefixEstimator,
    Solution,
    binary_search_first_errors,
    first_zero,
    label_solutions,
    labels_from_first_error,
    monte_carlo_labels,
    reference_first_error,
    search_cost,
    solution_steps,
    worst_case_rollouts,
)
from rewardlab.tasks import load
from rm_scripted import ScriptedPolicy, chain_row


def _estimator(policy, k=4):
    return PrefixEstimator(policy, build_reward("worked_answer"), k=k)


def test_scripted_policy_and_row_are_consistent():
    row = chain_row("3+4-2+5")
    assert row["reference_steps"] == ["3+4=7", "7-2=5", "5+5=10"] and row["final"] == "10"
    assert ScriptedPolicy().continue_text(row, "3+4-2+5=3+4=7\n", 0) == "7-2=5\n5+5=10"


def test_solution_steps_strip_one_separator():
    assert solution_steps("3+4=7\n7-2=5") == ["3+4=7", "7-2=5"]
    assert solution_steps("a\n\nb") == ["a\n", "b"]  # a blank line stays inside its step: "\n".join gives it back
    assert "\n".join(solution_steps("a\n\nb")) == "a\n\nb"


def test_mc_labels_match_the_truth_on_a_hand_built_case():
    row = chain_row("3+4-2+5")  # reference 3+4=7, 7-2=5, 5+5=10
    wrong = Solution(prompt=row["prompt"], row=row, steps=["3+4=7", "7-2=6", "6+5=11"])  # step 1 is wrong
    right = Solution(prompt=row["prompt"], row=row, steps=["3+4=7", "7-2=5", "5+5=10"])
    est = _estimator(ScriptedPolicy())
    values = monte_carlo_labels(est, [wrong, right])
    # wrong: prefix "3+4=7" continues to 10 (value 1); prefix with "7-2=6" continues to 11 (0); the full text is
    # wrong (0). right: 1, 1, and the full text is right (1).
    assert values == [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert [first_zero(v) for v in values] == [reference_first_error(row, s.steps) for s in (wrong, right)]
    assert [first_zero(v) for v in values] == [1, -1]
    # k = 4 continuations for each of the S - 1 = 2 non-final prefixes of each solution: 2 * 2 * 4 = 16
    assert est.rollouts == 16 and est.evaluations == 4


def test_soft_labels_are_the_fraction_of_correct_continuations():
    row = chain_row("3+4-2+5")
    sol = Solution(prompt=row["prompt"], row=row, steps=["3+4=7", "7-2=5", "5+5=10"])
    # 1 of k=4 continuations slips on its first step: value 3/4 for each non-final prefix; the last is verified: 1
    rows = label_solutions("mc", _estimator(ScriptedPolicy(slips=1)), [sol], kind="soft")
    assert rows[0]["labels"] == [0.75, 0.75, 1.0]
    sol2 = Solution(prompt=row["prompt"], row=row, steps=["3+4=7", "7-2=5", "5+5=10"])
    hard = label_solutions("mc", _estimator(ScriptedPolicy(slips=3)), [sol2], kind="hard")
    assert hard[0]["labels"] == [1.0, 1.0, 1.0]  # 1 of 4 right is still "any": hard label 1
    assert hard[0]["values"] == {"0": 0.25, "1": 0.25, "2": 1.0}


def test_binary_search_finds_the_full_scans_first_error_with_fewer_rollouts():
    row = chain_row("1+2+3+4+5+6+7+8+9")  # 8 steps
    steps = list(row["reference_steps"])
    steps[5] = "15+6=22"  # reference "15+6=21": first error at step 5; later steps carry the error forward
    total = 22
    for i, t in enumerate([7, 8], start=6):
        steps[i] = f"{total}+{t}={total + t}"
        total += t
    assert reference_first_error(row, steps) == 5
    k = 4

    scan = _estimator(ScriptedPolicy(), k)
    full = monte_carlo_labels(scan, [Solution(row["prompt"], row, list(steps))])
    assert first_zero(full[0]) == 5
    assert scan.rollouts == k * (8 - 1) == 28  # every prefix but the last, k continuations each

    search = _estimator(ScriptedPolicy(), k)
    found = binary_search_first_errors(search, [Solution(row["prompt"], row, list(steps))])
    assert found == [5]
    # lo=-1, hi=7 -> mid 3 (value 1) -> lo=3; mid 5 (value 0) -> hi=5; mid 4 (value 1) -> lo=4: 3 evaluations
    assert search.evaluations == 3 == search_cost(8)
    assert search.rollouts == 3 * k == 12 < scan.rollouts


def test_binary_search_agrees_with_full_scan_at_every_error_position():
    row = chain_row("2+3+1+4+2+5+3")  # 6 steps
    for err in range(-1, 6):
        steps = list(row["reference_steps"])
        if err >= 0:  # make step err wrong by one and carry the error
            total = int(steps[err].split("=")[1]) + 1
            steps[err] = steps[err].split("=")[0] + f"={total}"
            for i in range(err + 1, len(steps)):
                t = int(row["reference_steps"][i].split("=")[0].split("+")[1])
                steps[i] = f"{total}+{t}={total + t}"
                total += t
        scan, search = _estimator(ScriptedPolicy(), 2), _estimator(ScriptedPolicy(), 2)
        full = first_zero(monte_carlo_labels(scan, [Solution(row["prompt"], row, list(steps))])[0])
        fast = binary_search_first_errors(search, [Solution(row["prompt"], row, list(steps))])[0]
        assert full == fast == err
        assert search.rollouts <= worst_case_rollouts("binary", 6, 2) == 2 * 3
        assert scan.rollouts == worst_case_rollouts("mc", 6, 2) == 2 * 5
        if err == -1:
            assert search.rollouts == 0  # a correct final answer ends the search before any sampling


def test_binary_labels_keep_steps_up_to_the_first_error():
    row = chain_row("3+4-2+5")
    sol = Solution(row["prompt"], row, ["3+4=7", "7-2=6", "6+5=11"])
    out = label_solutions("binary", _estimator(ScriptedPolicy()), [sol])[0]
    assert out["steps"] == ["3+4=7", "7-2=6"] and out["labels"] == [1.0, 0.0] and out["first_error"] == 1
    assert out["reference_first_error"] == 1


def test_reference_labels_need_no_rollouts():
    row = chain_row("3+4-2+5")
    out = label_solutions("reference", None, [Solution(row["prompt"], row, ["3+4=7", "7-2=6", "6+5=11"])])[0]
    assert out["labels"] == [1.0, 0.0, 0.0] and out["rollouts"] == 0
    assert out["first_error"] == out["reference_first_error"] == 1


def test_reference_labels_on_both_task_kinds():
    """worked:chain_sum and reasoning_gym:chain_sum (target: steps) rows get the same labels: the checker reads the
    expression from metadata and the final answer from `final` (worked) or `answer` (reasoning_gym)."""
    opts = dict(size=40, test_size=2, seed=0, min_terms=3, max_terms=3, min_digits=1, max_digits=1)
    worked = load("worked:chain_sum", **opts).train[:10]
    steps_rows = load("reasoning_gym:chain_sum", template="compact", target="steps", **opts).train[:10]
    for w, r in zip(worked, steps_rows):
        right = w["reference_steps"]
        early, wrong = right[:1], [right[0], right[1] + "1"]  # "7-2=5" -> "7-2=51"
        sols = [[Solution(row["prompt"], row, list(s)) for s in (right, early, wrong)] for row in (w, r)]
        out_w, out_r = (label_solutions("reference", None, s) for s in sols)
        assert [o["first_error"] for o in out_w] == [o["first_error"] for o in out_r] == [-1, 0, 1]
        assert [o["labels"] for o in out_w] == [[1.0, 1.0], [0.0], [1.0, 0.0]]


def test_reference_labels_need_an_expression():
    row = {"prompt": "3+4=", "answer": "7"}  # a jsonl-like row: no expression
    with pytest.raises(ValueError, match=r"^label.method=reference: the row has neither 'expression' nor "
                                         r"'metadata.expression'; .*target: steps"):
        label_solutions("reference", None, [Solution("3+4=", row, ["3+4=7"])])
    with pytest.raises(ValueError, match=r"^label.method=reference: expression '3\*4': expected integers"):
        reference_first_error({"expression": "3*4", "answer": "12"}, ["3*4=12"])


def test_mc_labels_add_the_reference_only_for_rows_with_a_chain():
    plain = {"prompt": "3+4=", "answer": "7"}
    sol = Solution("3+4=", plain, ["3+4=7"])  # one step: verified directly, no rollouts
    (out,) = label_solutions("mc", _estimator(ScriptedPolicy()), [sol])
    assert "reference_first_error" not in out and out["first_error"] == -1


def test_labels_from_first_error():
    assert labels_from_first_error(3, -1) == [1.0, 1.0, 1.0]
    assert labels_from_first_error(3, 1) == [1.0, 0.0, 0.0]


def test_estimator_batches_prefixes_into_few_generate_calls():
    row = chain_row("3+4-2+5")
    policy = ScriptedPolicy()
    est = PrefixEstimator(policy, build_reward("worked_answer"), k=2, batch_size=64)
    sols = [Solution(row["prompt"], row, ["3+4=7", "7-2=5", "5+5=10"]) for _ in range(5)]
    monte_carlo_labels(est, sols)
    assert policy.calls == 1 and policy.sampled == 5 * 2 * 2  # 5 solutions x 2 prefixes x k=2, one call


def test_chat_policies_are_refused():
    class ChatPolicy(ScriptedPolicy):
        prompt_format = "chat"

    with pytest.raises(ValueError, match="prompt_format=raw"):
        PrefixEstimator(ChatPolicy(), build_reward("worked_answer"), k=2)


def test_unknown_method():
    with pytest.raises(ValueError, match="label.method"):
        label_solutions("magic", None, [])


def test_reference_on_rows_without_a_chain_is_refused_before_the_run_directory_opens(tmp_path):
    from conftest import TINY_OVERRIDES, write_jsonl
    from rewardlab.config import PrmLabelConfig, load_config
    from rewardlab.commands.prm import label as run_prm_label

    task = write_jsonl(tmp_path / "task.jsonl", [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(6)])
    cfg = load_config(PrmLabelConfig, overrides=[f"out={tmp_path / 'run'}", f"task.spec=jsonl:{task}",
                                                 "task.options={test_size: 2}", "label.method=reference",
                                                 *TINY_OVERRIDES])
    with pytest.raises(ValueError, match=r"^label.method=reference: the row has neither 'expression' nor "
                                         r"'metadata.expression'; .* \(question 0 of the train split of jsonl:"):
        run_prm_label(cfg, show_progress=False)
    assert not (tmp_path / "run").exists()  # nothing written: the run can be started again as it is
