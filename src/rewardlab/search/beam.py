"""Step-level search with a step scorer (a PRM or a step-checking reward): beam search and DVTS.

A step is what `rewardlab.types.split_steps` calls one: text up to and including the separator. One step is
sampled by letting the policy continue the partial solution until it writes the separator (transformers
`stop_strings`), an end-of-sequence token, or `max_step_tokens`; a solution is finished when a step ends without
the separator (EOS, or the token limit: then it is marked truncated) or when it reaches `max_steps` steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rewardlab.policy.settings import SamplingSettings
from rewardlab.rewards.base import Reward
from rewardlab.search.base import SearchPolicy, SearchResult, SearchSettings, check_budget, pick_best, score_solutions
from rewardlab.types import Rollout, split_steps


#: The sampling of one step when a tree search is given none: 32 tokens at temperature 0.8.
STEP_SAMPLING = SamplingSettings(max_new_tokens=32, temperature=0.8)


@dataclass
class _Node:
    """A partial solution: the generated step rollouts (pieces) so far, and whether it is finished."""

    row: int
    pieces: list[Rollout]
    done: bool
    solution: Rollout

    @property
    def text(self) -> str:
        return self.solution.completion


def join_steps(pieces: Sequence[Rollout], separator: str = "\n", group: int = 0) -> Rollout:
    """One rollout from step pieces sampled one after another (each piece continues the ones before it).

    prompt and prompt_ids come from the first piece (its prompt is the formatted task prompt); completion,
    completion_ids and logprobs are the pieces' concatenated; `steps`/`step_text` follow `split_steps(completion,
    separator)`, each step's token span ending where the piece holding its last character ends (exact when pieces
    end at the separator, as sampled steps do); `truncated` is the last piece's.

    Raises:
        ValueError: on no pieces.
    """
    if not pieces:
        raise ValueError("join_steps: no pieces")
    completion = "".join(p.completion for p in pieces)
    ids = [t for p in pieces for t in p.completion_ids]
    logprobs = [x for p in pieces for x in p.logprobs]
    char_ends, tok_ends, c, t = [], [], 0, 0
    for p in pieces:
        c, t = c + len(p.completion), t + len(p.completion_ids)
        char_ends.append(c)
        tok_ends.append(t)
    spans = split_steps(completion, separator)
    steps: list[tuple[int, int]] = []
    step_text: list[str] = []
    start = 0
    for j, (a, b) in enumerate(spans):
        stop = len(ids) if j == len(spans) - 1 else next(te for ce, te in zip(char_ends, tok_ends) if ce >= b)
        if stop > start:
            steps.append((start, stop))
            step_text.append(completion[a:b])
        elif step_text:  # two steps inside one piece: the later joins the earlier
            step_text[-1] += completion[a:b]
        start = max(start, stop)
    first = pieces[0]
    return Rollout(prompt=first.prompt, prompt_ids=list(first.prompt_ids), completion=completion, completion_ids=ids,
                   logprobs=logprobs, row=first.row, group=group, steps=steps, step_text=step_text,
                   truncated=pieces[-1].truncated)


def _expand(policy: SearchPolicy, rows: Sequence[dict[str, Any]], parents: list[tuple[int, _Node | None]], k: int,
            depth: int, tree: _Tree) -> list[_Node]:
    """k one-step children of each parent (row index, node or None for the root), parent-major."""
    if not parents:
        return []
    sep, sampling = tree.search.separator, tree.sampling
    per_call = max(1, tree.search.batch_size // k)
    pieces: list[Rollout] = []
    for start in range(0, len(parents), per_call):
        chunk = parents[start : start + per_call]
        pieces += policy.generate(
            [rows[i]["prompt"] for i, _ in chunk],
            n=k,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_new_tokens=sampling.max_new_tokens,
            rows=[rows[i] for i, _ in chunk],
            prefixes=[node.text if node is not None else "" for _, node in chunk],
            stop=sep,
        )
    children = []
    for idx, piece in enumerate(pieces):
        i, parent = parents[idx // k]
        tail = parent.text[len(parent.text) - len(sep) + 1 :] if parent is not None and len(sep) > 1 else ""
        ended_step = sep in tail + piece.completion  # stopped at the separator (else EOS or the token limit)
        chain = (parent.pieces if parent is not None else []) + [piece]
        solution = join_steps(chain, sep, group=i)
        children.append(_Node(i, chain, not ended_step or depth >= tree.max_steps, solution))
    return children


@dataclass(frozen=True)
class _Tree:
    """A tree search's settings, checked together (`_tree`)."""

    sampling: SamplingSettings
    max_steps: int
    search: SearchSettings


def _tree(n: int, beam_width: int, sampling: SamplingSettings | None, max_steps: int,
          search: SearchSettings) -> _Tree:
    check_budget(n, beam_width)
    sampling = sampling or STEP_SAMPLING
    if max_steps < 1:
        raise ValueError(f"search.max_steps: must be >= 1, got {max_steps}")
    if sampling.max_new_tokens < 1:
        raise ValueError(f"search.max_step_tokens: must be >= 1, got {sampling.max_new_tokens}")
    if not search.separator:
        raise ValueError("search.separator: must be a non-empty string")
    return _Tree(sampling, max_steps, search)


def _result(finished: list[tuple[_Node, float]], tokens: int, calls: int) -> SearchResult:
    scores = [s for _, s in finished]
    best = pick_best(scores)
    return SearchResult(best=finished[best][0].solution, score=scores[best],
                        candidates=[node.solution for node, _ in finished], scores=scores, tokens=tokens,
                        scorer_calls=calls, info={"steps": [len(node.pieces) for node, _ in finished]})


def beam(policy: SearchPolicy, rows: Sequence[dict[str, Any]], scorer: Reward,
         sampling: SamplingSettings | None = None, *, n: int, beam_width: int, max_steps: int = 8,
         search: SearchSettings = SearchSettings()) -> list[SearchResult]:
    """Step-level beam search with a step scorer (Snell et al. 2024; search-and-learn, Beeching et al. 2024).

    N beams, beam width M. Step 1: sample N first steps. Then, until no beam is open: score every new partial
    solution with the scorer (score = `solution_score`, step scores aggregated by `aggregate`); solutions that
    finished (EOS, step token limit, or `max_steps` steps) leave the beam; of the open ones keep the top N/M by
    score (ties to the earlier one) and sample M next steps from each. The answer is the finished solution with the
    highest score (ties to the one that finished first).

    Budget: each round scores exactly the partial solutions it generated, so scorer calls =
    N + sum over later rounds of M * (open beams kept, at most N/M); with no beam finishing early that is
    N * (number of rounds). Unlike search-and-learn, the pool is not refilled to N when beams finish.

    Args:
        policy: a `rewardlab.policy.Policy` (or an object with its `generate(..., prefixes=, stop=)`).
        rows: task rows with `prompt`.
        scorer: any rewardlab `Reward`; a process scorer's `step_scores` (one per step of `Rollout.step_text`).
        sampling: `rewardlab.policy.SamplingSettings` of each step: max_new_tokens (the token limit of one step),
            temperature, top_p; None: `STEP_SAMPLING` (32 tokens, temperature 0.8).
        n: N, beams; beam_width: M, children per kept beam; M must divide N.
        max_steps: step limit (rounds of expansion).
        search: `SearchSettings`: separator (the text that ends a step), batch_size (about this many sequences per
            `generate` call), aggregate.
    Returns:
        one `SearchResult` per row: candidates = every finished solution; cost = all sampled step tokens (pruned
        branches included) and every scorer call.
    Raises:
        ValueError: n < 1, M not dividing N, max_steps < 1, a step's max_new_tokens < 1, empty separator, unknown
            aggregation.
    """
    tree = _tree(n, beam_width, sampling, max_steps, search)
    keep = n // beam_width
    tokens, calls = [0] * len(rows), [0] * len(rows)
    finished: list[list[tuple[_Node, float]]] = [[] for _ in rows]
    parents: list[tuple[int, _Node | None]] = [(i, None) for i in range(len(rows))]
    k, depth = n, 1
    while parents:
        children = _expand(policy, rows, parents, k, depth, tree)
        scores = score_solutions(scorer, [c.solution for c in children], search.aggregate)
        open_: list[list[tuple[_Node, float]]] = [[] for _ in rows]
        for child, s in zip(children, scores):
            tokens[child.row] += len(child.pieces[-1].completion_ids)
            calls[child.row] += 1
            (finished if child.done else open_)[child.row].append((child, s))
        parents = []
        for i, pool in enumerate(open_):
            top = sorted(sorted(range(len(pool)), key=lambda j: -pool[j][1])[:keep])  # stable: ties to the earlier
            parents += [(i, pool[j][0]) for j in top]
        k, depth = beam_width, depth + 1
    return [_result(finished[i], tokens[i], calls[i]) for i in range(len(rows))]


def dvts(policy: SearchPolicy, rows: Sequence[dict[str, Any]], scorer: Reward,
         sampling: SamplingSettings | None = None, *, n: int, beam_width: int, max_steps: int = 8,
         search: SearchSettings = SearchSettings()) -> list[SearchResult]:
    """Diverse verifier tree search, DVTS (Beeching, Tunstall and Rush 2024, "Scaling test-time compute with open
    models"; search-and-learn).

    N/M independent subtrees per row. Each subtree, from the prompt: sample M candidate next steps, score each
    partial solution (`solution_score` with `aggregate`), keep the best one (ties to the first), and continue from
    it until the kept solution is finished (EOS, step token limit, or `max_steps` steps). The answer is the best of
    the N/M finished subtree solutions by their last score (ties to the first subtree).

    Budget: each round scores M candidates per open subtree, so scorer calls = M * sum over rounds of open
    subtrees; with no subtree finishing early that is N * (number of rounds).

    Args, Returns and Raises: as for `beam` (candidates = the N/M subtree solutions).
    """
    tree = _tree(n, beam_width, sampling, max_steps, search)
    tokens, calls = [0] * len(rows), [0] * len(rows)
    subtrees = n // beam_width
    final: list[list[tuple[_Node, float] | None]] = [[None] * subtrees for _ in rows]
    parents: list[tuple[int, _Node | None]] = [(i, None) for i in range(len(rows)) for _ in range(subtrees)]
    tree_of = [t for _ in rows for t in range(subtrees)]  # subtree index of each parent
    depth = 1
    while parents:
        children = _expand(policy, rows, parents, beam_width, depth, tree)
        scores = score_solutions(scorer, [c.solution for c in children], search.aggregate)
        next_parents: list[tuple[int, _Node | None]] = []
        next_tree: list[int] = []
        for p in range(len(parents)):
            group = children[p * beam_width : (p + 1) * beam_width]
            group_scores = scores[p * beam_width : (p + 1) * beam_width]
            for child in group:
                tokens[child.row] += len(child.pieces[-1].completion_ids)
                calls[child.row] += 1
            j = pick_best(group_scores)
            chosen = group[j]
            if chosen.done:
                final[chosen.row][tree_of[p]] = (chosen, group_scores[j])
            else:
                next_parents.append((chosen.row, chosen))
                next_tree.append(tree_of[p])
        parents, tree_of, depth = next_parents, next_tree, depth + 1
    return [_result([f for f in final[i] if f is not None], tokens[i], calls[i]) for i in range(len(rows))]
