"""Say why a tree-attention output is wrong: the mask, the loop over key tiles, or the rescale.

A kernel of the ladder returns only its output, so the diagnosis replays attention in float64
under the hypotheses a wrong kernel most often obeys, on the first few failing rows whose
output is finite (a NaN row has its own causes, listed by compare_floats):

1. The loop stops at a tile edge: every examined row equals attention over its visible keys
   below one common key index c, a multiple of the tile: key tile c / tile onward is skipped.
2. One key's visibility is flipped: each examined row equals attention with exactly one key
   shown or hidden wrongly; the first such (query, key) pair is named as the mask checks name it.
3. The mask follows another rule: every examined row equals attention under one of MASK_SLIPS
   (query and key swapped, one of the two interval tests left out, an off-by-one on either);
   the first (query, key) pair where that rule departs from the tree's is named.
4. The loop stops inside a tile: as 1, for any c. It comes after 2, since a row that misses
   only itself also "stops" below itself when its ancestors come first.
5. A rescale is missing: the online softmax (FlashAttention, Dao et al. 2022, Alg. 1) must
   multiply the running sum and output by exp(m_old - m_new) when a key tile raises the running
   max. Each examined row is replayed tile by tile in float64 with the accumulator's rescale, the
   sum's, or both left out; if one of these replays matches every row, the check says which
   rescale is missing and names the first key tile that raises the running max of the first
   failing row: there the kernel first goes wrong (rows whose max never rises are right).

A hypothesis is accepted only when it reproduces every examined row within the check's
tolerance, so a kernel wrong in some other way (a race, say) gets no diagnosis rather than a
wrong one.
"""

from __future__ import annotations

import math

import torch

from course import oracle
from course.checks.diagnose import explain_pair

EXAMINED_ROWS = 8  # enough rows to tell a rule from a coincidence, few enough to stay fast
EXPLAINED = 0.02  # a replay within 2% of a row's error from the reference explains that row


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

    def close(b, h, r, replayed) -> bool:
        """Within the check's tolerance, or near enough to explain nearly all of the row's error:
        a 16-bit kernel rounds P before P.V, and a wrong sum of large terms carries that further."""
        miss = float((got[b, h, r] - replayed).abs().max())
        return (bool(torch.allclose(got[b, h, r], replayed, atol=atol, rtol=rtol))
                or miss <= EXPLAINED * float((got[b, h, r] - want[b, h, r]).abs().max()))

    def matches(b, h, r, keys) -> bool:
        return close(b, h, r, _attention_row(q[b, h, r], k[b, h], v[b, h], keys, scale))

    # In the order of the module's docstring: the likelier story first.
    return (_loop_stops_early(rows, visible, matches, tile, range(tile, visible.shape[-1], tile))
            or _mask_flips_one_key(rows, visible, matches, start, end)
            or _mask_follows_another_rule(rows, visible, matches, start, end)
            or _loop_stops_early(rows, visible, matches, tile, range(1, visible.shape[-1]))
            or _missing_rescale(rows, visible, q, k, v, scale, tile, close))


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


def _mask_follows_another_rule(rows, visible, matches, start, end) -> str:
    """Every examined row equals attention under one of MASK_SLIPS; name its first wrong pair."""
    for rule, name in MASK_SLIPS:
        slipped = rule(start.unsqueeze(-2), end.unsqueeze(-2), start.unsqueeze(-1), end.unsqueeze(-1))
        if all(matches(b, h, r, slipped[b, r]) for b, h, r in rows):
            b, _, r = rows[0]
            key = int(torch.nonzero(slipped[b, r] ^ visible[b, r])[0])
            pair = explain_pair(bool(slipped[b, r, key]), b, r, key, start, end)
            return (f"batch {b}: the output is attention under the mask {name} instead of "
                    f"start[key] <= start[query] and end[query] <= end[key]: {pair}")
    return ""


# Visibility rules a kernel writes by mistake, over (key start, key end, query start, query end).
MASK_SLIPS = (
    (lambda sk, ek, sq, eq: (sq <= sk) & (ek <= eq), "of descendants (query and key swapped)"),
    (lambda sk, ek, sq, eq: sk <= sq, "start[key] <= start[query] (the end test left out)"),
    (lambda sk, ek, sq, eq: eq <= ek, "end[query] <= end[key] (the start test left out)"),
    (lambda sk, ek, sq, eq: (sk <= sq) & (eq <= ek + 1), "with end[key] + 1 (an off-by-one)"),
    (lambda sk, ek, sq, eq: (sk <= sq + 1) & (eq <= ek), "with start[query] + 1 (an off-by-one)"),
)


def _missing_rescale(rows, visible, q, k, v, scale: float, tile: int, close) -> str:
    """Every examined row equals the online softmax replayed without one of its rescales."""
    for rescale_acc, rescale_sum, what in RESCALE_SLIPS:
        if all(close(b, h, r, _online_softmax(visible[b, r], q[b, h, r], k[b, h], v[b, h], scale,
                                              tile, rescale_acc, rescale_sum))
               for b, h, r in rows):
            b, h, r = rows[0]
            key_tile, old, new = _first_raise(visible[b, r], q[b, h, r], k[b, h], scale, tile)
            return (f"batch {b}, head {h}: every failing row checked ({len(rows)}) equals the "
                    f"online softmax replayed with {what} never rescaled by exp(m_old - m_new) "
                    f"(missing rescale?). Row {r} goes wrong at key tile {key_tile}, the first "
                    f"that raises its running max (from {old:.4g} to {new:.4g}); rows whose max "
                    "never rises after their first key tile are untouched")
    return ""


# (rescale the output accumulator, rescale the running sum, what a kernel left unscaled)
RESCALE_SLIPS = ((False, True, "the output accumulator"), (True, False, "the running sum"),
                 (False, False, "the output accumulator and the running sum"))


def _online_softmax(keys, query, keys_k, keys_v, scale: float, tile: int, rescale_acc: bool,
                    rescale_sum: bool) -> torch.Tensor:
    """One row of FlashAttention's loop over key tiles (Dao et al. 2022, Alg. 1), in float64,
    with either rescale by alpha = exp(m_old - m_new) optionally left out."""
    scores = (keys_k @ query) * scale
    running_max, running_sum = float("-inf"), 0.0
    acc = torch.zeros_like(query)
    for first in range(0, keys.shape[0], tile):
        seen = keys[first:first + tile]
        if not seen.any():
            continue
        tile_scores = scores[first:first + tile][seen]
        new_max = max(running_max, float(tile_scores.max()))
        p = torch.exp(tile_scores - new_max)
        alpha = math.exp(running_max - new_max)
        acc = (alpha if rescale_acc else 1.0) * acc + p @ keys_v[first:first + tile][seen]
        running_sum = (alpha if rescale_sum else 1.0) * running_sum + float(p.sum())
        running_max = new_max
    return acc / running_sum


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
