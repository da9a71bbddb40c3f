"""Say why a tree-attention output is wrong: the mask, the loop over key tiles, or the rescale.

A kernel of the ladder returns only its output, so the diagnosis replays attention in float64
under the hypotheses a wrong kernel most often obeys, on the first few failing rows whose
output is finite (a NaN row has its own causes, listed by compare_floats):

1. The loop stops early: every examined row equals attention over its visible keys below one
   common key index c (c a multiple of the tile: a whole key tile is skipped; a c inside a tile
   is tried only after hypothesis 2).
2. The mask is wrong: each examined row equals attention with exactly one key's visibility
   flipped; the first such (query, key) pair is named as the mask checks name it.
3. The rescale is missing: the online softmax (FlashAttention, Dao et al. 2022, Alg. 1) must
   multiply the running sum and output by exp(m_old - m_new) when a key tile raises the running
   max; a kernel that forgets it is right on every row whose max is set by its first visible key
   tile and wrong exactly on rows where a later tile raises it. If every failing row is such a
   row, the first one and the tile that raised its max are named.
"""

from __future__ import annotations

import math

import torch

from course import oracle
from course.checks.diagnose import explain_pair

EXAMINED_ROWS = 8  # enough rows to tell a rule from a coincidence, few enough to stay fast


def explain_tree_attention(got, q, k, v, start, end, tile: int, atol: float, rtol: float) -> str:
    """'' when no hypothesis fits, else one sentence naming the key bound, the pair or the tile."""
    got, q, k, v = (t.detach().cpu().double() for t in (got, q, k, v))
    start, end = start.cpu().long(), end.cpu().long()
    want, _ = oracle.tree_attention(q, k, v, start, end)
    visible = oracle.dense_tree_mask(start, end)  # (B, N, N)
    failing = ((got - want).abs() > atol + rtol * want.abs()).any(-1) & got.isfinite().all(-1)
    rows = [tuple(int(i) for i in row) for row in torch.nonzero(failing)[:EXAMINED_ROWS]]
    if not rows:
        return ""
    scale = 1 / math.sqrt(q.shape[-1])

    def matches(b, h, r, keys) -> bool:
        replayed = _attention_row(q[b, h, r], k[b, h], v[b, h], keys, scale)
        return bool(torch.allclose(got[b, h, r], replayed, atol=atol, rtol=rtol))

    # A bound at a tile edge is the likelier story than one flipped key; a bound inside a tile
    # is tried after the mask, since a row that misses only itself also "stops" below itself.
    return (_loop_stops_early(rows, visible, matches, tile, range(tile, visible.shape[-1], tile))
            or _mask_flips_one_key(rows, visible, matches, start, end)
            or _loop_stops_early(rows, visible, matches, tile, range(1, visible.shape[-1]))
            or _missing_rescale(rows, visible, q, k, scale, tile))


def _attention_row(query, keys_k, keys_v, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax over the keys where `keys` is True; NaN when there are none (0/0)."""
    if not keys.any():
        return torch.full_like(query, float("nan"))
    weights = torch.softmax((keys_k[keys] @ query) * scale, dim=0)
    return weights @ keys_v[keys]


def _loop_stops_early(rows, visible, matches, tile: int, bounds) -> str:
    """A key index among `bounds` below which every examined row's output is exactly right."""
    below = torch.arange(visible.shape[-1])
    for bound in bounds:
        if all(matches(b, h, r, visible[b, r] & (below < bound)) for b, h, r in rows):
            b, h, r = rows[0]
            last = int(torch.nonzero(visible[b, r])[-1])
            where = (f"it skips key tile {bound // tile} (keys {bound} onward)" if bound % tile == 0
                     else f"it skips keys {bound} onward, inside key tile {bound // tile}")
            return (f"batch {b}, head {h}: every failing row checked ({len(rows)}) equals attention "
                    f"over its visible keys below key {bound} only (row {r} also sees key {last}): "
                    f"{where} (an off-by-one in the number of key tiles or the key bound?)")
    return ""


def _mask_flips_one_key(rows, visible, matches, start, end) -> str:
    """The first examined row equals attention with one key's visibility flipped."""
    flips = []
    for b, h, r in rows:
        flipped = [key for key in range(visible.shape[-1])
                   if matches(b, h, r, visible[b, r] ^ (torch.arange(visible.shape[-1]) == key))]
        if not flipped:
            return ""
        flips.append((b, r, flipped[0]))
    b, r, key = flips[0]
    pair = explain_pair(not bool(visible[b, r, key]), b, r, key, start, end)
    hides_self = all(query == key for _, query, key in flips)
    also = " (every failing row checked misses itself: a strict < where <= belongs?)" \
        if hides_self else ""
    return f"batch {b}: the output is attention under a wrong mask: {pair}{also}"


def _missing_rescale(rows, visible, q, k, scale: float, tile: int) -> str:
    """Every examined row has a later key tile that raises its running max."""
    raises = [_first_raise(visible[b, r], q[b, h, r], k[b, h], scale, tile) for b, h, r in rows]
    if not all(raises):
        return ""
    b, h, r = rows[0]
    key_tile, old, new = raises[0]
    return (f"batch {b}, head {h}: every failing row checked ({len(rows)}) has a later key tile "
            f"that raises its running max (row {r}: key tile {key_tile} raises it from {old:.4g} "
            f"to {new:.4g}): the running sum or output accumulator is not rescaled by "
            "exp(m_old - m_new) when a later tile raises the max (missing rescale?); rows whose max "
            "never rises after their first key tile are not touched by this bug")


def _first_raise(keys: torch.Tensor, query, keys_k, scale: float, tile: int):
    """(key tile, old max, new max) where the running max over visible keys first rises, or None."""
    scores = (keys_k @ query) * scale
    running = None
    for start in range(0, keys.shape[0], tile):
        seen = keys[start:start + tile]
        if not seen.any():
            continue
        tile_max = float(scores[start:start + tile][seen].max())
        if running is not None and tile_max > running:
            return start // tile, running, tile_max
        running = tile_max if running is None else max(running, tile_max)
    return None
