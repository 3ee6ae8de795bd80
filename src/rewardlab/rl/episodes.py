"""Credit for episodes that span several rows: the episode view, and minibatches of whole episodes.

An episode (a multi-turn rollout, `rewardlab.envs`) may be split into several rows (`Rollout`s sharing an
`episode_id`) when a chat template is not append-only. Its credit must not depend on how many rows it became, so
credit is computed on an *episode view* and scattered back:

    view = EpisodeView(mask, episode, order)      # mask [N, T]: 1 on sampled tokens only
    view.gather(x)  # [N, T] -> [E, L]: episode e's sampled tokens, its rows in order, environment tokens dropped
    view.scatter(y) # [E, L] -> [N, T]: back to the rows, 0 on every token that was not sampled

    advantages = episode_advantages(name, token_rewards=, mask=, group=, episode=, order=, **inputs)   # [N, T]

Every registered estimator runs on the view unchanged: the outcome reward sits on the episode's last sampled
token, per-turn rewards on each turn's last sampled token, critic values at sampled positions; so `gae`'s
V_{t+1} after a turn's last token is the value of the next turn's first sampled token (it bootstraps across
environment tokens and never treats a turn end as terminal), and a group statistic counts each episode once. The
view orders episodes by their id and the tokens of an episode by (row order, column), so any split of the same
episodes into rows gives the same view tensors, hence bit-identical advantages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rewardlab.policy.batch import episode_chunks
from rewardlab.rl.advantages import compute_advantages
from rewardlab.rl.segments import Segments

__all__ = ["EpisodeView", "episode_advantages", "episode_minibatches", "episode_tensors", "PER_ROLLOUT_INPUTS"]

#: Estimator inputs with one value per rollout ([N] or [N, K]) rather than per token: on the view, an episode takes
#: its rows' common value (they must agree).
PER_ROLLOUT_INPUTS = ("baseline", "components")


class EpisodeView:
    """The sampled tokens of each episode, concatenated over its rows: [E, L] tensors.

    Args:
        mask: [N, T] bool/0-1, 1 exactly on the tokens the policy sampled (the rows' loss mask before any
            truncation masking); environment, tool, template and padding tokens are 0.
        episode: [N] int64 episode id of each row (rows of one episode share it; any integers); None: each row is
            its own episode.
        order: [N] int64 position of each row within its episode (e.g. `Rollout.first_turn`; any increasing
            integers); None: the rows' order in the batch.
    Attributes:
        ids: [E] int64 the episode ids, ascending (view row e is episode ids[e]).
        row_episode: [N] int64 the view row of each batch row.
        mask: [E, L] float32, 1 on the view's tokens (L = the most sampled tokens of an episode, at least 1).
        identity: True when the view is the rows themselves (each episode one row, rows in id order, every row's
            sampled tokens a prefix of it): `gather`/`scatter` still work, and `episode_advantages` runs the
            estimator on the rows directly.
    Raises:
        ValueError: ``mask`` is not [N, T], ``episode``/``order`` is not [N], or two rows of an episode share an
            ``order`` value (their order would be ambiguous).
    """

    def __init__(self, mask: Tensor, episode: Tensor | None = None, order: Tensor | None = None):
        if mask.dim() != 2:
            raise ValueError(f"mask must be [N, T], got shape {tuple(mask.shape)}")
        n, t = mask.shape
        device = mask.device
        rows = torch.arange(n, device=device)
        if episode is None:
            episode = rows
        if tuple(episode.shape) != (n,):
            raise ValueError(f"episode must be [N] = [{n}], got shape {tuple(episode.shape)}")
        if order is None:
            order = rows
        if tuple(order.shape) != (n,):
            raise ValueError(f"order must be [N] = [{n}], got shape {tuple(order.shape)}")
        self._episodes = Segments(episode.long())
        self.ids, self.row_episode = self._episodes.ids, self._episodes.inverse
        e = self.ids.shape[0]
        # rows sorted by (episode, order, batch position): two stable sorts
        by_order = torch.sort(order.long(), stable=True).indices
        sorted_rows = by_order[torch.sort(self.row_episode[by_order], stable=True).indices]
        same = (self.row_episode[sorted_rows[1:]] == self.row_episode[sorted_rows[:-1]]) & \
               (order[sorted_rows[1:]] == order[sorted_rows[:-1]])
        if bool(same.any()):
            j = int(same.nonzero()[0])
            a, b = int(sorted_rows[j]), int(sorted_rows[j + 1])
            raise ValueError(f"order: rows {a} and {b} of episode {int(episode[a])} both have order {int(order[a])}")
        rank = torch.empty_like(rows)
        rank[sorted_rows] = rows
        on = mask > 0
        r, c = on.nonzero(as_tuple=True)
        perm = torch.argsort(rank[r] * max(t, 1) + c)
        self._r, self._c = r[perm], c[perm]
        self._e = self.row_episode[self._r]
        counts = self._episodes.sum(on.sum(dim=1))  # [E] sampled tokens of each episode
        start = torch.cumsum(counts, 0) - counts
        self._p = torch.arange(self._r.shape[0], device=device) - start[self._e]
        self.length = max(int(counts.max()) if e else 0, 1)
        self.shape = (n, t)
        self.mask = torch.zeros(e, self.length, dtype=torch.float32, device=device)
        self.mask[self._e, self._p] = 1.0
        prefix = bool((on[:, 1:] <= on[:, :-1]).all()) if t > 1 else True
        self.identity = e == n and prefix and bool((self.row_episode == rows).all())

    @property
    def episodes(self) -> int:
        """E, the number of episodes."""
        return int(self.ids.shape[0])

    def gather(self, x: Tensor) -> Tensor:
        """[N, T] (any dtype) -> [E, L]: each episode's sampled tokens in order, 0 after its last.

        Raises: ValueError if x is not [N, T]."""
        if tuple(x.shape) != self.shape:
            raise ValueError(f"expected a [N, T] = {list(self.shape)} tensor, got shape {tuple(x.shape)}")
        out = torch.zeros(self.episodes, self.length, dtype=x.dtype, device=x.device)
        out[self._e, self._p] = x[self._r, self._c]
        return out

    def scatter(self, y: Tensor) -> Tensor:
        """[E, L] -> [N, T]: each view token back to its row and column; 0 on every token that was not sampled.

        Raises: ValueError if y is not [E, L]."""
        if tuple(y.shape) != (self.episodes, self.length):
            raise ValueError(f"expected a [E, L] = [{self.episodes}, {self.length}] tensor, got {tuple(y.shape)}")
        out = torch.zeros(self.shape, dtype=y.dtype, device=y.device)
        out[self._r, self._c] = y[self._e, self._p]
        return out

    def per_episode(self, x: Tensor, name: str = "input") -> Tensor:
        """A per-row value [N, ...] -> [E, ...]: each episode's value, which all its rows must share.

        Raises: ValueError naming ``name`` if x is not [N, ...] or the rows of an episode disagree."""
        n = self.shape[0]
        if x.dim() == 0 or x.shape[0] != n:
            raise ValueError(f"{name} must be [N = {n}, ...], got shape {tuple(x.shape)}")
        first = self._episodes.min(torch.arange(n, device=self.row_episode.device))  # [E] each episode's first row
        out = x[first]
        back = out[self.row_episode]
        differ = (back != x) & ~(torch.isnan(back) & torch.isnan(x)) if x.dtype.is_floating_point else back != x
        if bool(differ.any()):
            i = int(differ.reshape(n, -1).any(dim=1).nonzero()[0])
            raise ValueError(f"{name}: the rows of episode {int(self.ids[self.row_episode[i]])} disagree (row {i} "
                             f"differs from row {int(first[self.row_episode[i]])}); it has one value per episode")
        return out


def episode_advantages(name: str, *, token_rewards: Tensor, mask: Tensor, group: Tensor,
                       episode: Tensor | None = None, order: Tensor | None = None, **inputs: Any) -> Tensor:
    """Advantages of estimator ``name`` computed on the episode view and scattered back to the rows.

    Every [N, T] tensor input (``values``, ``step_rewards``, ``step_mask``, ``turn_rewards``, ``turn_index``,
    ``turn_key``, ...) is gathered to the view; ``group`` and the per-rollout inputs (``PER_ROLLOUT_INPUTS``:
    ``baseline`` [N], ``components`` [N, K]) take each episode's value (its rows must agree); everything else
    (options such as ``eps``, ``weights`` [K]) is passed unchanged. When every episode is one row whose sampled
    tokens are a prefix of it (`EpisodeView.identity`, e.g. single-turn training), the estimator runs on the rows
    directly, so the result equals ``compute_advantages(name, ...)`` exactly.

    Args:
        name: a registered estimator.
        token_rewards: [N, T] float, the outcome reward on the episode's last sampled token (of its last row).
        mask: [N, T] bool/0-1, 1 exactly on sampled tokens.
        group: [N] int64, prompt-group id (the same on all rows of an episode).
        episode: [N] int64 episode ids, or None (each row its own episode).
        order: [N] int64 row order within an episode (e.g. `Rollout.first_turn`), or None (batch order).
        **inputs: the estimator's options and trainer inputs, as for ``compute_advantages``.
    Returns:
        [N, T] float32 advantages, 0 on every token that was not sampled.
    Raises:
        ValueError: what ``EpisodeView`` and ``compute_advantages`` raise, or a per-episode input (``group``,
            ``baseline``, ``components``) whose rows of one episode disagree.
    """
    view = EpisodeView(mask, episode, order)
    if view.identity:
        return compute_advantages(name, token_rewards=token_rewards, mask=mask, group=group, **inputs)
    shape = tuple(mask.shape)
    moved: dict[str, Any] = {}
    for key, value in inputs.items():
        if isinstance(value, Tensor) and tuple(value.shape) == shape:
            moved[key] = view.gather(value)
        elif isinstance(value, Tensor) and key in PER_ROLLOUT_INPUTS:
            moved[key] = view.per_episode(value, f"input {key!r}")
        else:
            moved[key] = value
    advantages = compute_advantages(name, token_rewards=view.gather(token_rewards), mask=view.mask,
                                    group=view.per_episode(group, "group"), **moved)
    return view.scatter(advantages)


def episode_minibatches(episode: Tensor | None, size: int | None, generator: torch.Generator | None = None,
                        *, n: int | None = None) -> list[Tensor]:
    """Row indices split into minibatches of whole episodes, in a random order of episodes.

    The episodes are shuffled (``torch.randperm(E, generator=generator)``) and cut into chunks of ``size``
    episodes; each minibatch holds the rows of its episodes, in batch order within an episode. With
    ``episode=None`` (each row its own episode; pass ``n``) this is ``torch.randperm(n).split(size)``, the
    trainer's single-turn minibatches, draw for draw.

    Args:
        episode: [N] int64 episode id of each row, or None.
        size: episodes per minibatch (the last may have fewer); None or 0: one minibatch of everything.
        generator: the torch generator to shuffle with (None: the global one).
        n: the number of rows, required when ``episode`` is None.
    Returns:
        list of 1-D int64 tensors of row indices; every row appears in exactly one.
    Raises:
        ValueError: ``size`` < 0, or ``episode`` None without ``n``.
    """
    if size is not None and size < 0:
        raise ValueError(f"minibatch size must be >= 0, got {size}")
    if episode is None:
        if n is None:
            raise ValueError("episode_minibatches: give episode ids or the number of rows n")
        return list(torch.randperm(n, generator=generator).split(size or max(n, 1)))
    episodes = Segments(episode)
    inverse, e = episodes.inverse, episodes.segments
    perm = torch.randperm(e, generator=generator)
    rank = torch.empty_like(perm)
    rank[perm] = torch.arange(e)
    return episode_chunks(inverse, rank, size or max(e, 1))  # episodes in shuffled order, rows in batch order


def episode_tensors(rollouts: Sequence[Any], width: int, *, state_ids: dict[str, int] | None = None
                    ) -> dict[str, Tensor]:
    """The credit inputs of a batch of rows, from their `Rollout` episode fields, as [N, width] tensors
    (completion tokens, right-padded; width >= the longest completion).

    Returns a dict with:
        sampled: [N, T] float32, `Rollout.loss_mask` (1 on sampled tokens).
        episode: [N] int64, `episode_id` (a row without one gets a fresh id above every given one).
        order: [N] int64, `first_turn` (the row's position in its episode).
        turn_index: [N, T] int64, the episode-wide turn of each sampled token (first_turn + the turn's index in
            `turns`); -1 on every other token.
        turn_rewards: [N, T] float32, `turn_rewards[k]` on the last sampled token of turn k, else 0.
        turn_key: [N, T] int64, on every sampled token of turn k the id of `turn_keys[k]` (ids from ``state_ids``,
            string -> id, extended in place with unseen keys; a turn without a key gets a fresh id of its own, so it
            never shares an anchor group); -1 elsewhere.
    Raises:
        ValueError: a row whose `turns`, `turn_rewards` or `turn_keys` lengths disagree, or a completion longer than
            ``width``.
    """
    n = len(rollouts)
    ids = state_ids if state_ids is not None else {}
    sampled = torch.zeros(n, width)
    turn_index = torch.full((n, width), -1, dtype=torch.long)
    turn_rewards = torch.zeros(n, width)
    turn_key = torch.full((n, width), -1, dtype=torch.long)
    given = [r.episode_id for r in rollouts if r.episode_id is not None]
    fresh = (max(given) + 1) if given else 0
    episode, order = [], []
    unkeyed = 0
    for i, r in enumerate(rollouts):
        length = len(r.completion_ids)
        if length > width:
            raise ValueError(f"row {i}: completion of {length} tokens is longer than the batch width {width}")
        turns = list(r.turns)
        if r.turn_rewards and len(r.turn_rewards) != len(turns):
            raise ValueError(f"row {i}: {len(r.turn_rewards)} turn_rewards for {len(turns)} turns")
        if r.turn_keys and len(r.turn_keys) != len(turns):
            raise ValueError(f"row {i}: {len(r.turn_keys)} turn_keys for {len(turns)} turns")
        lm = torch.tensor(r.loss_mask, dtype=torch.float32)
        sampled[i, :length] = lm
        for k, (start, end) in enumerate(turns):
            span = torch.arange(start, end)
            on = span[lm[start:end] > 0]
            if on.numel() == 0:
                continue
            turn_index[i, on] = r.first_turn + k
            if r.turn_rewards:
                turn_rewards[i, on[-1]] = float(r.turn_rewards[k])
            if r.turn_keys:
                turn_key[i, on] = ids.setdefault(r.turn_keys[k], len(ids))
            else:
                unkeyed += 1
                turn_key[i, on] = -1 - unkeyed  # a key of its own
        if r.episode_id is None:
            episode.append(fresh)
            fresh += 1
        else:
            episode.append(r.episode_id)
        order.append(r.first_turn)
    return {"sampled": sampled, "episode": torch.tensor(episode, dtype=torch.long),
            "order": torch.tensor(order, dtype=torch.long), "turn_index": turn_index,
            "turn_rewards": turn_rewards, "turn_key": turn_key}
