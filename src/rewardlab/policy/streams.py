"""Counter-based random streams for sampling: the uniform draw of a row's t-th new token is a hash of (the row's
stream key, t), so what a row samples does not depend on the batch it is in, its position there, the other rows or
torch's global generator.

A stream is a tuple of ints, e.g. (seed, step, episode index, refill round, turn). `stream_words` turns each into
four 32-bit words once per call (BLAKE2b of its decimal text, in Python); `hashed_uniform` mixes the words with the
token index, vectorised over the rows, with torch int64 arithmetic that never overflows; `inverse_cdf` picks the
token whose cumulative-probability interval holds the uniform.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Sequence

import torch

_MASK32 = 0xFFFFFFFF


def stream_words(streams: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    """[N, 4] int64 tensor of 32-bit words (each in [0, 2^32)) keying each stream: the first 16 bytes of
    BLAKE2b("s:" + the ints in decimal, comma-separated), read as 4 little-endian uint32.

    Raises:
        ValueError: a stream that is not a non-empty tuple/list of ints (bools are refused).
    """
    rows = []
    for i, stream in enumerate(streams):
        if not isinstance(stream, (tuple, list)) or not stream or not all(
                isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in stream):
            raise ValueError(f"streams[{i}]: expected a non-empty tuple of ints, got {stream!r}")
        digest = hashlib.blake2b(("s:" + ",".join(str(int(x)) for x in stream)).encode(), digest_size=16).digest()
        rows.append([int.from_bytes(digest[4 * k: 4 * k + 4], "little") for k in range(4)])
    return torch.tensor(rows, dtype=torch.long, device=device).view(len(rows), 4)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 `x` in [0, 2^32) and a constant c < 2^32, without int64 overflow: x is split in
    16-bit halves, so no product exceeds 2^48."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer hash of int64 `x` in [0, 2^32) (elementwise; same shape, values in [0, 2^32)):
    Wellons' "lowbias32" (2018): x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16, with
    the products taken mod 2^32. Shifts of non-negative int64 values are logical shifts."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hashed_uniform(words: torch.Tensor, t: int) -> torch.Tensor:
    """[N] float64 uniforms in [0, 1), one per row of `words` ([N, 4] int64 from `stream_words`), for token index
    `t` (>= 0, taken mod 2^32):

        hi = mix32(w0 ^ mix32(w1 ^ t)),  lo = mix32(w2 ^ mix32(w3 ^ t)),  u = (hi * 2^21 + lo >> 11) / 2^53

    so u has 53 random bits (every value is exact in float64) and depends only on (the stream, t).
    """
    tt = torch.full_like(words[:, 0], t & _MASK32)
    hi = mix32(words[:, 0] ^ mix32(words[:, 1] ^ tt))
    lo = mix32(words[:, 2] ^ mix32(words[:, 3] ^ tt))
    return ((hi << 21) | (lo >> 11)).double() / float(2**53)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse-CDF draws: for each row r, the first token k with cdf[k] > u[r] * cdf[V-1], where cdf is the float64
    cumulative sum of its distribution (so a token of probability 0 is never picked, and the distribution need not
    sum to exactly 1).

    Args:
        probs: [M, V] probabilities (any float dtype; cumulated in float64).
        u: [R] float64 uniforms in [0, 1).
        index: [R] int64, the row of `probs` each draw uses (None: R == M, row r uses row r).
    Returns:
        [R] int64 token ids.
    """
    p = probs.double()
    cdf = p.cumsum(dim=-1)
    V = p.shape[-1]
    last = V - 1 - (p > 0).flip(-1).to(torch.int8).argmax(dim=-1)  # the last token with mass (u * total rounding)
    if index is not None:
        cdf, last = cdf.index_select(0, index), last.index_select(0, index)
    x = (u.to(cdf.device, torch.float64) * cdf[:, -1]).unsqueeze(1)
    picked = torch.searchsorted(cdf.contiguous(), x, right=True).squeeze(1)
    return torch.minimum(picked, last)
