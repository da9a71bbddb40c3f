"""Say why a tree-attention output is wrong: the mask, the loop over key tiles, or the rescale.

A kernel of the ladder returns only its output, so the diagnosis replays attention in float64
under the hypotheses a wrong kernel most often obeys, on the first few failing rows whose
output is finite (a NaN row has its own causes, listed by compare_floats):

1. The loop stops at a tile edge: every examined row equals attention over its visible keys
   below one common key index c, a multiple of the tile: key tile c / tile onward is skipped
   (the largest such c: keys a row does not see fit any smaller one as well).
2. One key's visibility is flipped: each examined row equals attention with exactly one key
   shown or hidden wrongly; the first such (query, key) pair is named as the mask checks name it.
3. The mask follows another rule: every examined row equals attention under one of MASK_SLIPS
   (query and key swapped, one of the two interval tests left out, an off-by-one on either);
   the first (query, key) pair where that rule departs from the tree's is named.
4. The loop stops inside a tile: as 1, for any c. It comes after 2, since a row that misses
   only itself also "stops" below itself when its ancestors come first.
5. One key tile is skipped: every examined row equals attention over its visible keys outside
   one key tile that it sees (a tile-skipping test that reads the wrong tile's entry).
6. A rescale is missing: the online softmax (FlashAttention, Dao et al. 2022, Alg. 1) must
   multiply the running sum and output by exp(m_old - m_new) when a key tile raises the running
   max. Each examined row is replayed tile by tile in float64 with the accumulator's rescale, the
   sum's, or both left out; if one of these replays matches every row, the check says which
   rescale is missing and names the first key tile that raises the running max of the first
   failing row: there the kernel first goes wrong (rows whose max never rises are right).
7. The scores are not scaled: every examined row equals softmax(QK^T) V without the 1/sqrt(d).
8. The final division is wrong: every examined row is the right output times a constant of its
   own, so P and P.V are right and the row was divided by the wrong sum.

Rows that are NaN get one hypothesis of their own: each sees no key in the first key tile, so a
tile where it has seen nothing yet gave exp(-inf - (-inf)) = NaN (the shift by 0 is missing).

A hypothesis is accepted only when it reproduces every examined row within the check's
tolerance, so a kernel wrong in some other way (a race, say) gets no diagnosis rather than a
wrong one. The same hypotheses serve any mask (`explain_attention`): the tree's, a dense one, or
the non-square masks of a KV cache; a mask given by DFS intervals also gets its rule named
(`explain_tree_attention`).
"""

from __future__ import annotations

import math

import torch

from course import oracle
from course.checks.diagnose import explain_pair

EXAMINED_ROWS = 8  # enough rows to tell a rule from a coincidence, few enough to stay fast
EXPLAINED = 0.02  # a replay within 2% of a row's error from the reference explains that row


TREE_RULE = "start[key] <= start[query] and end[query] <= end[key]"


def explain_tree_attention(got, q, k, v, start, end, tile: int, atol: float, rtol: float) -> str:
    """'' when no hypothesis fits, else one sentence naming the key bound, the pair or the tile."""
    start, end = start.cpu().long(), end.cpu().long()
    slips = [(rule(start.unsqueeze(-2), end.unsqueeze(-2), start.unsqueeze(-1), end.unsqueeze(-1)), name)
             for rule, name in MASK_SLIPS]
    return explain_attention(got, q, k, v, oracle.dense_tree_mask(start, end), tile, atol, rtol,
                             pair=lambda shown, b, query, key: explain_pair(shown, b, query, key, start, end),
                             rule=TREE_RULE, slips=slips)


def mask_pair(shown: bool, b: int, query: int, key: int) -> str:
    """A wrongly shown or hidden (query, key) pair of a mask that is given as a tensor."""
    if shown:
        return f"the kernel let query {query} see key {key}, which the mask hides"
    return f"the kernel hid key {key} from query {query}, which the mask shows"


def explain_attention(got, q, k, v, visible, tile: int, atol: float, rtol: float, *, pair=mask_pair,
                      rule: str = "", slips=(), batch: str | None = "batch") -> str:
    """'' when no hypothesis fits, else one sentence naming the key bound, the pair or the tile.

    got, q: (B, H, N, d) or (B, N, d); k, v: (B, H, M, d) or (B, M, d); visible: (B, N, M) bool,
    key tiles of `tile` keys. pair(shown, b, query, key) names a pair the kernel got wrong; slips
    are (mask (B, N, M), name) of rules a kernel may follow by mistake instead of `rule`. batch: what
    the messages call an entry of the first dimension (None: nothing, where B is 1 by construction).
    """
    with_heads = got.dim() == 4
    got, q, k, v = (t.detach().cpu().double() for t in (got, q, k, v))
    if not with_heads:
        got, q, k, v = (t.unsqueeze(1) for t in (got, q, k, v))
    visible = visible.cpu().bool()
    scale = 1 / math.sqrt(q.shape[-1])
    want = torch.nan_to_num(oracle.attention_with_lse(q, k, v, visible.unsqueeze(1))[0])  # no key: 0

    def place(b, h=None) -> str:
        """'batch b, head h: ' (what of it the messages name), or '' where there is nothing to name."""
        parts = ([f"{batch} {b}"] if batch else []) + ([f"head {h}"] if with_heads and h is not None else [])
        return ", ".join(parts) + ": " if parts else ""

    nan_rows = _rows(got.isnan().any(-1))
    why_nan = _nan_from_an_empty_first_tile(nan_rows, visible, tile, place) if nan_rows else ""
    failing = ((got - want).abs() > atol + rtol * want.abs()).any(-1) & got.isfinite().all(-1)
    rows = _rows(failing)
    if why_nan or not rows:
        return why_nan

    def close(b, h, r, replayed) -> bool:
        """Within the check's tolerance, or near enough to explain nearly all of the row's error:
        a 16-bit kernel rounds P before P.V, and a wrong sum of large terms carries that further."""
        miss = float((got[b, h, r] - replayed).abs().max())
        return (bool(torch.allclose(got[b, h, r], replayed, atol=atol, rtol=rtol))
                or miss <= EXPLAINED * float((got[b, h, r] - want[b, h, r]).abs().max()))

    def matches(b, h, r, keys, row_scale=scale) -> bool:
        return close(b, h, r, _attention_row(q[b, h, r], k[b, h], v[b, h], keys, row_scale))

    # In the order of the module's docstring: the likelier story first.
    keys = visible.shape[-1]
    tile_edges = range(tile * ((keys - 1) // tile), 0, -tile)
    return (_loop_stops_early(rows, visible, matches, tile, tile_edges, place)
            or _skips_one_tile(rows, visible, matches, tile, place)
            or _mask_flips_one_key(rows, visible, matches, pair, place)
            or _mask_follows_another_rule(rows, visible, matches, pair, rule, slips, place)
            or _loop_stops_early(rows, visible, matches, tile, range(keys - 1, 0, -1), place)
            or _missing_rescale(rows, visible, q, k, v, scale, tile, close, place)
            or _unscaled_scores(rows, visible, matches, place)
            or _rows_scaled(rows, got, want, close, place))


def _rows(flags: torch.Tensor) -> list[tuple[int, int, int]]:
    """The first EXAMINED_ROWS (b, h, r) where flags is set."""
    return [tuple(int(i) for i in row) for row in torch.nonzero(flags)[:EXAMINED_ROWS]]


def _attention_row(query, keys_k, keys_v, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax over the keys where `keys` is True; 0 when there are none (as kernels write a row
    that sees nothing: a NaN row is examined apart)."""
    if not keys.any():
        return torch.zeros_like(keys_v[0])
    weights = torch.softmax((keys_k[keys] @ query) * scale, dim=0)
    return weights @ keys_v[keys]


def _nan_from_an_empty_first_tile(rows, visible, tile: int, place) -> str:
    """Every examined NaN row sees no key of key tile 0, so its first step had no key to shift by."""
    firsts = []
    for b, _, r in rows:
        seen = torch.nonzero(visible[b, r]).flatten()
        if not len(seen) or int(seen[0]) < tile:
            return ""
        firsts.append(int(seen[0]))
    b, h, r = rows[0]
    return (f"{place(b, h)}every NaN row checked ({len(rows)}) sees no key in key tile 0 (row {r}'s "
            f"first key is {firsts[0]}, in key tile {firsts[0] // tile}): while a row has seen no key its "
            "running max is -inf, and exp(s - m) = exp(-inf - (-inf)) is NaN unless such a row shifts by 0 "
            "instead")


def _loop_stops_early(rows, visible, matches, tile: int, bounds, place) -> str:
    """The first key index among `bounds` (the largest first: where the loop really stops) below
    which every examined row's output is exactly right."""
    below = torch.arange(visible.shape[-1])
    for bound in bounds:
        if all(matches(b, h, r, visible[b, r] & (below < bound)) for b, h, r in rows):
            b, h, r = rows[0]
            last = int(torch.nonzero(visible[b, r])[-1])
            where = (f"it skips key tile {bound // tile} (keys {bound} onward)" if bound % tile == 0
                     else f"it skips keys {bound} onward, inside key tile {bound // tile}")
            return (f"{place(b, h)}every failing row checked ({len(rows)}) equals attention "
                    f"over its visible keys below key {bound} only (row {r} also sees key {last}): "
                    f"{where} (an off-by-one in the number of key tiles or the key bound?)")
    return ""


def _skips_one_tile(rows, visible, matches, tile: int, place) -> str:
    """Every examined row equals attention without the keys of one key tile that it sees."""
    keys = torch.arange(visible.shape[-1])
    for j in range(0, visible.shape[-1], tile):
        in_tile = (keys >= j) & (keys < j + tile)
        if all(bool((visible[b, r] & in_tile).any()) and matches(b, h, r, visible[b, r] & ~in_tile)
               for b, h, r in rows):
            b, h, r = rows[0]
            seen = int(torch.nonzero(visible[b, r] & in_tile)[0])
            last = min(j + tile, len(keys)) - 1
            return (f"{place(b, h)}every failing row checked ({len(rows)}) equals attention over its "
                    f"visible keys without key tile {j // tile} (keys {j} to {last}), which row {r} sees "
                    f"(key {seen}): the kernel skips a key tile its rows need (does the "
                    "skip test read the entry of the right (query tile, key tile) pair?)")
    return ""


def _mask_flips_one_key(rows, visible, matches, pair, place) -> str:
    """The first examined row equals attention with one key's visibility flipped."""
    flips = []
    for b, h, r in rows:
        flipped = [key for key in range(visible.shape[-1])
                   if matches(b, h, r, visible[b, r] ^ (torch.arange(visible.shape[-1]) == key))]
        if not flipped:
            return ""
        flips.append((b, r, flipped[0]))
    b, r, key = flips[0]
    hides_self = all(query == key for _, query, key in flips)
    also = " (every failing row checked misses itself: a strict < where <= belongs?)" \
        if hides_self else ""
    wrong = pair(not bool(visible[b, r, key]), b, r, key)
    return f"{place(b)}the output is attention under a wrong mask: {wrong}{also}"


def _mask_follows_another_rule(rows, visible, matches, pair, rule: str, slips, place) -> str:
    """Every examined row equals attention under one of the slips; name its first wrong pair."""
    for slipped, name in slips:
        if all(matches(b, h, r, slipped[b, r]) for b, h, r in rows):
            b, _, r = rows[0]
            key = int(torch.nonzero(slipped[b, r] ^ visible[b, r])[0])
            return (f"{place(b)}the output is attention under the mask {name} instead of {rule}: "
                    f"{pair(bool(slipped[b, r, key]), b, r, key)}")
    return ""


# Visibility rules a kernel writes by mistake, over (key start, key end, query start, query end).
MASK_SLIPS = (
    (lambda sk, ek, sq, eq: (sq <= sk) & (ek <= eq), "of descendants (query and key swapped)"),
    (lambda sk, ek, sq, eq: sk <= sq, "start[key] <= start[query] (the end test left out)"),
    (lambda sk, ek, sq, eq: eq <= ek, "end[query] <= end[key] (the start test left out)"),
    (lambda sk, ek, sq, eq: (sk <= sq) & (eq <= ek + 1), "with end[key] + 1 (an off-by-one)"),
    (lambda sk, ek, sq, eq: (sk <= sq + 1) & (eq <= ek), "with start[query] + 1 (an off-by-one)"),
)


def _missing_rescale(rows, visible, q, k, v, scale: float, tile: int, close, place) -> str:
    """Every examined row equals the online softmax replayed without one of its rescales."""
    for rescale_acc, rescale_sum, what in RESCALE_SLIPS:
        if all(close(b, h, r, _online_softmax(visible[b, r], q[b, h, r], k[b, h], v[b, h], scale,
                                              tile, rescale_acc, rescale_sum))
               for b, h, r in rows):
            b, h, r = rows[0]
            key_tile, old, new = _first_raise(visible[b, r], q[b, h, r], k[b, h], scale, tile)
            return (f"{place(b, h)}every failing row checked ({len(rows)}) equals the "
                    f"online softmax replayed with {what} never rescaled by exp(m_old - m_new) "
                    f"(missing rescale?). Row {r} goes wrong at key tile {key_tile}, the first "
                    f"that raises its running max (from {old:.4g} to {new:.4g}); rows whose max "
                    "never rises after their first key tile are untouched")
    return ""


def _unscaled_scores(rows, visible, matches, place) -> str:
    """Every examined row equals softmax(QK^T) V: the scores were not multiplied by 1/sqrt(d)."""
    if all(matches(b, h, r, visible[b, r], 1.0) for b, h, r in rows):
        b, h, r = rows[0]
        return (f"{place(b, h)}every failing row checked ({len(rows)}, the first row {r}) equals "
                "softmax(q k^T) v without the scale: the scores are not multiplied by 1/sqrt(d)")
    return ""


def _rows_scaled(rows, got, want, close, place) -> str:
    """Every examined row is the right output times a factor of its own (not 1)."""
    factors = []
    for b, h, r in rows:
        norm = float(want[b, h, r] @ want[b, h, r])
        factor = float(got[b, h, r] @ want[b, h, r]) / norm if norm else 1.0
        if abs(factor - 1) < 1e-3 or not close(b, h, r, factor * want[b, h, r]):
            return ""
        factors.append(factor)
    b, h, r = rows[0]
    return (f"{place(b, h)}every failing row checked ({len(rows)}) is the right output times a factor of "
            f"its own (row {r}: {factors[0]:.4g} times): its softmax weights and P.V are right, and it was "
            "divided by the wrong sum at the end (another row's running sum?)")


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
