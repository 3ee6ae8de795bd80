"""The search methods end to end on scripted policies: best-of-N against pass@N, votes, beam search and DVTS budgets.

The task: "3+4-2=" worked in steps; the right steps are "3+4=7" then "7-2=5".
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardlab.rewards import build_reward
from rewardlab.search import SearchSettings, beam, best_of_n, dvts, join_steps, majority, weighted_majority
from rewardlab.types import Rollout

from scripted_policy import EOS, KnownStepScorer, ScriptedPolicy, TableScorer

RIGHT = ["3+4=7", "7-2=5"]
ROW = {"prompt": "3+4-2=", "answer": "5"}


# ---------------------------------------------------------------- best-of-N
@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["5", "6", "7"]), min_size=8, max_size=8), min_size=1, max_size=5),
       st.sampled_from([1, 2, 3, 8]))
def test_best_of_n_with_the_verifier_as_scorer_equals_pass_at_n(samples, n):
    # The oracle scorer is the task's verifier (exact match with answer "5"): best-of-N picks a right sample exactly
    # when one of the N is right, so its accuracy is pass@N of the same N samples.
    rows = [{"prompt": f"q{i}", "answer": "5"} for i in range(len(samples))]
    policy = ScriptedPolicy(solutions={f"q{i}": s for i, s in enumerate(samples)})
    verifier = build_reward("exact_match")
    results = best_of_n(policy, rows, verifier, n=n)
    accuracy = sum(verifier([r.best])[0].score for r in results) / len(rows)
    pass_at_n = sum("5" in s[:n] for s in samples) / len(rows)
    assert accuracy == pass_at_n
    assert all(r.scorer_calls == n and len(r.candidates) == n for r in results)


def test_best_of_n_with_a_constant_scorer_is_the_first_sample():
    # q0's samples 6, 5, 5: the first is wrong although two are right; q1's first, 5, is right.
    policy = ScriptedPolicy(solutions={"q0": ["6", "5", "5"], "q1": ["5", "7", "7"]})
    rows = [{"prompt": "q0", "answer": "5"}, {"prompt": "q1", "answer": "5"}]
    results = best_of_n(policy, rows, TableScorer({}), n=3)  # every completion scores 0.0
    assert [r.best.completion for r in results] == ["6", "5"]


def test_best_of_n_records_tokens_and_scorer_calls():
    policy = ScriptedPolicy(solutions={"q": ["12", "345"]})
    scorer = TableScorer({"345": 1.0})
    (r,) = best_of_n(policy, [{"prompt": "q"}], scorer, n=4)
    # samples 12, 345, 12, 345: tokens (2+1) + (3+1) + 3 + 4 = 14 with one EOS each; 4 scored; the first 345 wins.
    assert (r.tokens, r.scorer_calls, scorer.scored) == (14, 4, 4)
    assert r.best is r.candidates[1] and r.score == 1.0


def test_best_of_n_aggregates_step_scores():
    # "3+4=7\n7-2=4" has step scores [1, 0]; "3+4=8\n8-2=6" [0, 0]; "3+4=7\n7-2=5" [1, 1].
    policy = ScriptedPolicy(solutions={"3+4-2=": ["3+4=7\n7-2=4", "3+4=8\n8-2=6", "3+4=7\n7-2=5"]})
    (by_last,) = best_of_n(policy, [ROW], KnownStepScorer(RIGHT), n=3, search=SearchSettings(aggregate="last"))
    assert by_last.scores == [0.0, 0.0, 1.0] and by_last.best.completion == "3+4=7\n7-2=5"
    policy = ScriptedPolicy(solutions={"3+4-2=": ["3+4=7\n7-2=4", "3+4=8\n8-2=6"]})
    (by_mean,) = best_of_n(policy, [ROW], KnownStepScorer(RIGHT), n=2, search=SearchSettings(aggregate="mean"))
    assert by_mean.scores == [0.5, 0.0] and by_mean.best.completion == "3+4=7\n7-2=4"


def test_best_of_n_validates_n():
    with pytest.raises(ValueError, match="search.n"):
        best_of_n(ScriptedPolicy(), [ROW], TableScorer({}), n=0)


# ---------------------------------------------------------------- votes
def test_majority_votes_on_final_answers():
    # final answers 4, 5, 5, 6: 5 wins with two votes; its first sample is index 1.
    policy = ScriptedPolicy(solutions={"3+4-2=": ["3+4=7\n7-2=4", "3+4=7\n7-2=5", "3+5=8\n8-3=5", "9-3=6"]})
    (r,) = majority(policy, [ROW], n=4)
    assert (r.answer, r.score, r.best.completion) == ("5", 2.0, "3+4=7\n7-2=5")
    assert r.scorer_calls == 0


def test_weighted_majority_votes_with_scores():
    # answers 4 (score 1.0), 5 (0.25 + 0.5 = 0.75): weighted, 4 wins; unweighted 5 would.
    policy = ScriptedPolicy(solutions={"q": ["x=4", "x=5", "y=5"]})
    scorer = TableScorer({"x=4": 1.0, "x=5": 0.25, "y=5": 0.5})
    (r,) = weighted_majority(policy, [{"prompt": "q"}], scorer, n=3)
    assert (r.answer, r.score, r.scorer_calls) == ("4", 1.0, 3)


# ---------------------------------------------------------------- beam search
def test_beam_search_finds_the_right_steps_and_spends_its_budget():
    # N=4 beams, M=2. Round 1: 4 first steps 3+4=8, 3+4=7, 3+4=8, 3+4=7 -> last-step scores 0, 1, 0, 1; keep the top
    # N/M = 2 (both 3+4=7). Round 2: each expanded M=2 times: 7-2=4, 7-2=5, 7-2=4, 7-2=5 (all end: EOS).
    # Scorer calls: 4 + 2 * 2 = 8. Tokens: 4 steps * 6 characters + 4 steps * (5 characters + EOS) = 48.
    policy = ScriptedPolicy(steps={"": ["3+4=8\n", "3+4=7\n"], "3+4=7\n": ["7-2=4", "7-2=5"]})
    scorer = KnownStepScorer(RIGHT)
    (r,) = beam(policy, [ROW], scorer, n=4, beam_width=2, max_steps=5)
    assert r.best.completion == "3+4=7\n7-2=5" and r.score == 1.0
    assert r.scorer_calls == scorer.scored == 8
    assert r.tokens == 48
    assert len(r.candidates) == 4
    assert [c["prefixes"] for c in policy.calls] == [[""], ["3+4=7\n", "3+4=7\n"]]
    assert all(c["stop"] == "\n" for c in policy.calls)


def test_beam_search_finished_beams_leave_the_pool():
    # N=6, M=2 -> keep 3. Round 1: 9, 3+4=7, 3+4=8, 9, 3+4=7, 3+4=8; the two "9" end at once (EOS). The 4 open ones
    # score 1, 0, 1, 0: keep 3+4=7, 3+4=8 (first of the tied zeros), 3+4=7. Round 2: 3 beams * 2 = 6 children.
    # Scorer calls: 6 + 6 = 12 (refilling to N, as search-and-learn does, would not change this case).
    policy = ScriptedPolicy(steps={"": ["9", "3+4=7\n", "3+4=8\n"], "3+4=7\n": ["7-2=5", "7-2=4"],
                                   "3+4=8\n": ["8-2=6"]})
    scorer = KnownStepScorer(RIGHT)
    (r,) = beam(policy, [ROW], scorer, n=6, beam_width=2, max_steps=5)
    assert r.scorer_calls == scorer.scored == 12
    assert [c["prefixes"] for c in policy.calls][1] == ["3+4=7\n", "3+4=8\n", "3+4=7\n"]
    # candidates: the two "9" (round 1), then 7-2=5, 7-2=4, 8-2=6, 8-2=6, 7-2=5, 7-2=4 (round 2)
    assert [c.completion for c in r.candidates][:2] == ["9", "9"] and len(r.candidates) == 8
    assert r.best.completion == "3+4=7\n7-2=5"


def test_beam_search_stops_at_the_step_limit():
    # max_steps=1: every first step is final; N scorer calls; the best first step is not a whole answer.
    policy = ScriptedPolicy(steps={"": ["3+4=8\n", "3+4=7\n"]})
    (r,) = beam(policy, [ROW], KnownStepScorer(RIGHT), n=4, beam_width=2, max_steps=1)
    assert r.scorer_calls == 4 and len(r.candidates) == 4
    assert r.best.completion == "3+4=7\n"


def test_beam_search_runs_rows_side_by_side():
    # Two rows share each generate call; each row's cost is its own: 8 calls and 48 tokens as in the first test.
    policy = ScriptedPolicy(steps={"": ["3+4=8\n", "3+4=7\n"], "3+4=7\n": ["7-2=4", "7-2=5"]})
    out = beam(policy, [ROW, dict(ROW)], KnownStepScorer(RIGHT), n=4, beam_width=2, max_steps=5)
    assert [(r.scorer_calls, r.tokens, r.best.completion) for r in out] == [(8, 48, "3+4=7\n7-2=5")] * 2
    assert len(policy.calls) == 2  # one generate call per round


@pytest.mark.parametrize("n, m", [(4, 3), (2, 4), (4, 0)])
def test_beam_width_must_divide_n(n, m):
    with pytest.raises(ValueError, match="search.beam_width"):
        beam(ScriptedPolicy(), [ROW], TableScorer({}), n=n, beam_width=m)


# ---------------------------------------------------------------- DVTS
def test_dvts_finds_the_right_steps_and_spends_its_budget():
    # N=4, M=2 -> 2 subtrees. Round 1: subtree 0 draws 3+4=8, 3+4=7 -> keeps 3+4=7; subtree 1 the same.
    # Round 2: each draws 7-2=4, 7-2=5 -> keeps 7-2=5 (ends). Scorer calls: 2 * 2 + 2 * 2 = 8.
    policy = ScriptedPolicy(steps={"": ["3+4=8\n", "3+4=7\n"], "3+4=7\n": ["7-2=4", "7-2=5"]})
    scorer = KnownStepScorer(RIGHT)
    (r,) = dvts(policy, [ROW], scorer, n=4, beam_width=2, max_steps=5)
    assert r.best.completion == "3+4=7\n7-2=5"
    assert r.scorer_calls == scorer.scored == 8
    assert [c.completion for c in r.candidates] == ["3+4=7\n7-2=5"] * 2  # N/M = 2 subtree solutions


def test_dvts_subtree_that_finishes_early_stops_spending():
    # Round 1: subtree 0 draws "9", 3+4=8 (both score 0: the tie keeps "9", which has ended); subtree 1 draws 3+4=8,
    # 3+4=7 and keeps 3+4=7. Round 2: only subtree 1 draws: 7-2=4, 7-2=5. Calls: 2 + 2 + 2 = 6, not 8.
    policy = ScriptedPolicy(steps={"": ["9", "3+4=8\n", "3+4=8\n", "3+4=7\n"], "3+4=7\n": ["7-2=4", "7-2=5"]})
    scorer = KnownStepScorer(RIGHT)
    (r,) = dvts(policy, [ROW], scorer, n=4, beam_width=2, max_steps=5)
    assert r.scorer_calls == scorer.scored == 6
    assert [c.completion for c in r.candidates] == ["9", "3+4=7\n7-2=5"]  # in subtree order
    assert r.best.completion == "3+4=7\n7-2=5" and r.scores == [0.0, 1.0]


def test_dvts_step_limit():
    # max_steps=2 with steps that never end: 2 rounds of N=4 candidates each -> 8 calls; solutions have 2 steps.
    policy = ScriptedPolicy(steps={"": ["3+4=7\n"], "3+4=7\n": ["7-2=5\n"]})
    (r,) = dvts(policy, [ROW], KnownStepScorer(RIGHT), n=4, beam_width=2, max_steps=2)
    assert r.scorer_calls == 8 and r.info["steps"] == [2, 2]


# ---------------------------------------------------------------- joining steps
def test_join_steps_concatenates_pieces_and_marks_steps():
    a = Rollout("q", [1], "3+4=7\n", [51, 43, 52, 61, 55, 10], [-0.5] * 6, row={"answer": "5"})
    b = Rollout("q3+4=7\n", [1, 2], "7-2=5", [55, 45, 50, 61, 53, EOS], [-0.25] * 6)
    r = join_steps([a, b], "\n", group=3)
    assert r.completion == "3+4=7\n7-2=5" and r.completion_ids == a.completion_ids + b.completion_ids
    assert r.logprobs == [-0.5] * 6 + [-0.25] * 6
    assert r.steps == [(0, 6), (6, 12)] and r.step_text == ["3+4=7\n", "7-2=5"]
    assert (r.prompt, r.prompt_ids, r.row, r.group) == ("q", [1], {"answer": "5"}, 3)


def test_join_steps_merges_a_blank_piece_into_the_step_before():
    # split_steps merges the whitespace-only piece "\n" into "1+1=2\n": one step covering both pieces' tokens.
    a = Rollout("q", [1], "1+1=2\n", [1] * 6, [0.0] * 6)
    b = Rollout("q", [1], "\n", [10], [0.0])
    r = join_steps([a, b], "\n")
    assert r.steps == [(0, 7)] and r.step_text == ["1+1=2\n\n"]
