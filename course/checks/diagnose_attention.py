"""Say why a tree-attention output is wrong: the mask, the loop over key tiles, or the rescale.

A kernel of the ladder returns only its output, so the diagnosis replays attention in float64
under the hypotheses a wrong kernel most often obeys, on the first few failing rows whose
output is finite (a NaN row has its own causes, listed by compare_floats):

Each hypothesis tests one cause (KEY_BOUND, SKIP_TEST, ...), and a check declares the causes its
exercise's code can have, so a kernel with no skip test never hears of one. In this order:

1. The loop stops at a tile edge (KEY_BOUND): every examined row equals attention over its visible
   keys below one common key index c, a multiple of the tile: key tile c / tile onward is skipped
   (the largest such c: keys a row does not see fit any smaller one as well).
2. One key tile is skipped (SKIP_TEST): every examined row equals attention over its visible keys
   outside one key tile that it sees (a tile-skipping test that reads the wrong tile's entry).
3. The running state is not carried (CARRIED_STATE): every examined row equals attention over the
   keys of the last key tile where it sees one, and every NaN row sees no key in the last key tile
   (there it divided 0 by 0): each key tile started afresh.
4. The probabilities ignore the mask (PROBABILITY_MASK): every examined row equals attention over
   every key of the key tiles from its first visible key on, padding keys past the end included
   or not: the mask decided the max, but p = exp(s - m) was not set to 0 for hidden keys. It
   comes before 5 and 6, whose rules can coincide with "every key" on a chain.
5. One key's visibility is flipped (MASK_TEST): each examined row equals attention with exactly one
   key shown or hidden wrongly; the first such (query, key) pair is named as the mask checks name it.
6. The mask follows another rule (MASK_TEST): every examined row equals attention under one of
   MASK_SLIPS (query and key swapped, one of the two interval tests left out, an off-by-one on
   either); the first (query, key) pair where that rule departs from the tree's is named.
7. The loop stops inside a tile (KEY_BOUND): as 1, for any c. It comes after 5, since a row that
   misses only itself also "stops" below itself when its ancestors come first.
8. A rescale is missing (RESCALE): the online softmax (FlashAttention, Dao et al. 2022, Alg. 1)
   must multiply the running sum and output by exp(m_old - m_new) when a key tile raises the
   running max. Each examined row is replayed tile by tile in float64 with the accumulator's
   rescale, the sum's, or both left out; if one of these replays matches every row, the check says
   which rescale is missing and names the first key tile that raises the running max of the first
   failing row: there the kernel first goes wrong (rows whose max never rises are right).
9. The scores are not scaled (SCALE): every examined row equals softmax(QK^T) V without 1/sqrt(d).
10. Padding keys are seen (PADDING_KEYS): every examined row equals attention over its visible keys
   and the zero keys past the end of the last key tile (score 0). It comes before 12, which it
   also fits: such a row is the right one times a factor.
11. A tile is laid out wrong (TILE_LAYOUT): every examined row equals attention with the score tile
   of each (query tile, key tile) pair transposed, or with V's rows taken from K, or K's from V.
12. The final division is wrong (FINAL_SUM): every examined row is the right output times a
   constant of its own, so P and P.V are right and the row was divided by the wrong sum.

Rows that are NaN get one hypothesis of their own: each sees no key in the first key tile, so a
tile where it has seen nothing yet gave exp(-inf - (-inf)) = NaN (the shift by 0 is missing).
Where most values are wrong and nothing fits (nor a race), `most_values_wrong` says so: whole tiles
moved, not one row or key.

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
MOSTLY_WRONG = 0.5  # past this share of wrong values, the slip moved whole tiles, not a row or key

# The causes a diagnosis can name. An exercise's check declares those its kernel can have (a
# tile-skipping test only where the kernel skips tiles, ...): only those are tried, so a message
# never points at code the exercise does not have.
KEY_BOUND = "the key loop's bound"
SKIP_TEST = "a test that skips key tiles"
CARRIED_STATE = "the running max and sum carried from one key tile to the next"
MASK_TEST = "the mask test"
PROBABILITY_MASK = "the mask applied to the probabilities"
PADDING_KEYS = "the keys past the end, padding the last key tile"
RESCALE = "the rescale by exp(m_old - m_new)"
SCALE = "the scale 1/sqrt(d)"
FINAL_SUM = "the final division by the running sum"
TILE_LAYOUT = "the layout of the shared tiles"
EVERY_CAUSE = frozenset({KEY_BOUND, SKIP_TEST, CARRIED_STATE, MASK_TEST, PROBABILITY_MASK, PADDING_KEYS,
                         RESCALE, SCALE, FINAL_SUM, TILE_LAYOUT})


TREE_RULE = "start[key] <= start[query] and end[query] <= end[key]"


def explain_tree_attention(got, q, k, v, start, end, tile: int, atol: float, rtol: float,
                           causes: frozenset[str] = EVERY_CAUSE) -> str:
    """'' when no hypothesis fits, else one sentence naming the key bound, the pair or the tile."""
    start, end = start.cpu().long(), end.cpu().long()
    slips = [(rule(start.unsqueeze(-2), end.unsqueeze(-2), start.unsqueeze(-1), end.unsqueeze(-1)), name)
             for rule, name in MASK_SLIPS]
    return explain_attention(got, q, k, v, oracle.dense_tree_mask(start, end), tile, atol, rtol,
                             pair=lambda shown, b, query, key: explain_pair(shown, b, query, key, start, end),
                             rule=TREE_RULE, slips=slips, causes=causes)


def mask_pair(shown: bool, b: int, query: int, key: int) -> str:
    """A wrongly shown or hidden (query, key) pair of a mask that is given as a tensor."""
    if shown:
        return f"the kernel let query {query} see key {key}, which the mask hides"
    return f"the kernel hid key {key} from query {query}, which the mask shows"


def explain_attention(got, q, k, v, visible, tile: int, atol: float, rtol: float, *, pair=mask_pair,
                      rule: str = "", slips=(), batch: str | None = "batch",
                      causes: frozenset[str] = EVERY_CAUSE) -> str:
    """'' when no hypothesis fits, else one sentence naming the key bound, the pair or the tile.

    got, q: (B, H, N, d) or (B, N, d); k, v: (B, H, M, d) or (B, M, d); visible: (B, N, M) bool,
    key tiles of `tile` keys. pair(shown, b, query, key) names a pair the kernel got wrong; slips
    are (mask (B, N, M), name) of rules a kernel may follow by mistake instead of `rule`. batch: what
    the messages call an entry of the first dimension (None: nothing, where B is 1 by construction).
    causes: those of EVERY_CAUSE the exercise's kernel can have; only their hypotheses are tried.
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

    def matches(b, h, r, keys, row_scale=scale, padding=0, values=v) -> bool:
        return close(b, h, r, _attention_row(q[b, h, r], k[b, h], values[b, h], keys, row_scale, padding))

    # In the order of the module's docstring: the likelier story first; each only where it can be.
    keys = visible.shape[-1]
    tile_edges = range(tile * ((keys - 1) // tile), 0, -tile)
    padding = -keys % tile  # keys past the end in the last key tile
    hypotheses = (
        (KEY_BOUND, lambda: _loop_stops_early(rows, visible, matches, tile, tile_edges, place)),
        (SKIP_TEST, lambda: _skips_one_tile(rows, visible, matches, tile, place)),
        (CARRIED_STATE, lambda: _forgets_earlier_tiles(rows, nan_rows, visible, matches, tile, place)),
        (PROBABILITY_MASK, lambda: _unmasked_probabilities(rows, visible, matches, tile, padding, place)),
        (MASK_TEST, lambda: _mask_flips_one_key(rows, visible, matches, pair, place)),
        (MASK_TEST, lambda: _mask_follows_another_rule(rows, visible, matches, pair, rule, slips, place)),
        (KEY_BOUND, lambda: _loop_stops_early(rows, visible, matches, tile, range(keys - 1, 0, -1), place)),
        (RESCALE, lambda: _missing_rescale(rows, visible, q, k, v, scale, tile, close, place)),
        (SCALE, lambda: _unscaled_scores(rows, visible, matches, place)),
        (PADDING_KEYS, lambda: _padding_keys_seen(rows, visible, matches, padding, place)),
        (TILE_LAYOUT, lambda: _tiles_mixed_up(rows, visible, q, k, v, scale, tile, close, place)),
        (FINAL_SUM, lambda: _rows_scaled(rows, got, want, close, place)),
    )
    for cause, hypothesis in hypotheses:
        found = hypothesis() if cause in causes else ""
        if found:
            return found
    return ""


def _rows(flags: torch.Tensor) -> list[tuple[int, int, int]]:
    """The first EXAMINED_ROWS (b, h, r) where flags is set."""
    return [tuple(int(i) for i in row) for row in torch.nonzero(flags)[:EXAMINED_ROWS]]


def _attention_row(query, keys_k, keys_v, keys: torch.Tensor, scale: float, padding: int = 0) -> torch.Tensor:
    """softmax over the keys where `keys` is True, and over `padding` keys past the end whose
    key and value rows are zeros (score 0, as a kernel loads them); 0 when there are none (as
    kernels write a row that sees nothing: a NaN row is examined apart)."""
    if not keys.any():
        return torch.zeros_like(keys_v[0])
    scores = torch.cat([(keys_k[keys] @ query) * scale, torch.zeros(padding, dtype=query.dtype)])
    weights = torch.softmax(scores, dim=0)
    return weights[: int(keys.sum())] @ keys_v[keys]


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


def _forgets_earlier_tiles(rows, nan_rows, visible, matches, tile: int, place) -> str:
    """Every examined row equals attention over the keys of the last key tile where it sees one, and
    every NaN row sees no key in the last key tile: each key tile started the running state afresh
    (where the last one holds no key of the row, 0/0)."""
    last_tile = (visible.shape[-1] - 1) // tile
    tile_of = torch.arange(visible.shape[-1]) // tile
    for b, h, r in rows:
        seen = tile_of[visible[b, r]]
        if len(seen.unique()) < 2 or not matches(b, h, r, visible[b, r] & (tile_of == seen.max())):
            return ""
    if not all(visible[b, r].any() and not visible[b, r][tile_of == last_tile].any() for b, _, r in nan_rows):
        return ""
    b, h, r = rows[0]
    nan = (f", and every NaN row checked ({len(nan_rows)}) sees no key in the last key tile, where it "
           "divided 0 by 0" if nan_rows else "")
    return (f"{place(b, h)}every failing row checked ({len(rows)}) equals attention over the keys of the "
            f"last key tile where it sees a key only (row {r}: key tile {int(tile_of[visible[b, r]].max())})"
            f"{nan}: each key tile starts afresh, as if the rows had seen nothing before it (the running "
            "max and sum are not carried from one key tile to the next: stored back after each tile, "
            "and read at the next?)")


def _unmasked_probabilities(rows, visible, matches, tile: int, padding: int, place) -> str:
    """Every examined row equals attention over every key of the key tiles from its first visible
    key on (and, with `padding`, the zero keys past the end): its max is taken over the keys it
    sees, but p = exp(s - m) is not set to 0 for the others."""
    keys = torch.arange(visible.shape[-1])
    for pad, beyond in ((padding, ", and over the padding keys past the end of the last key tile"),
                        (0, "")):
        taken = []
        for b, h, r in rows:
            if not visible[b, r].any():
                break
            every = keys >= int(torch.nonzero(visible[b, r])[0]) // tile * tile
            if not matches(b, h, r, every, padding=pad):
                break
            taken.append(every)
        else:
            b, h, r = rows[0]
            seen, took = int(visible[b, r].sum()), int(taken[0].sum()) + pad
            return (f"{place(b, h)}every failing row checked ({len(rows)}) equals attention over every key "
                    f"of the key tiles from its first visible key on{beyond}, not only over the keys it sees "
                    f"(row {r} sees {seen} keys and takes {took}): "
                    "the probabilities ignore the mask. The mask test is right where the max is taken; "
                    "a key the row does not see must get p = 0, not exp(s - m)")
    return ""


def _padding_keys_seen(rows, visible, matches, padding: int, place) -> str:
    """Every examined row equals attention over its visible keys and the zero keys past the end that
    pad the last key tile: a key past the end must be hidden."""
    if not padding or not all(matches(b, h, r, visible[b, r], padding=padding) for b, h, r in rows):
        return ""
    b, h, r = rows[0]
    first = visible.shape[-1]
    return (f"{place(b, h)}every failing row checked ({len(rows)}) equals attention over its visible keys "
            f"and the {padding} keys past the end that pad the last key tile (keys {first} to "
            f"{first + padding - 1}: zero rows of K and V, so score 0): a key past the end must be hidden "
            "(its score -inf, its p 0), not only loaded as zeros")


def _tiles_mixed_up(rows, visible, q, k, v, scale: float, tile: int, close, place) -> str:
    """Every examined row equals attention with one of the tiles laid out wrong: the score tile
    transposed within each (query tile, key tile) pair, the value rows taken from K, or the key
    rows from V."""
    if q.shape[-2] != k.shape[-2]:
        return ""  # the transposed layout needs square tiles of one tree
    if all(close(b, h, r, _transposed_scores_row(q[b, h], k[b, h], v[b, h], visible[b, r], r, scale, tile))
           for b, h, r in rows):
        b, h, r = rows[0]
        first, place_in_tile = r // tile * tile, r % tile
        return (f"{place(b, h)}every failing row checked ({len(rows)}) equals attention with the score "
                "tile of every (query tile, key tile) pair transposed: "
                f"row {r}'s score for key c of a key tile is that of row {first} + c against key "
                f"{place_in_tile} of the tile (the score tile stored as s[row, key] where the kernel reads "
                "s_t[key, row], or the other way round?)")
    for values, keys_k, what in ((k, k, "the value rows are the key rows (V loaded from k, or the "
                                           "keys' staging copied where the values' belongs?)"),
                                 (v, v, "the key rows are the value rows (K loaded from v, or the "
                                           "values' staging copied where the keys' belongs?)")):
        if all(close(b, h, r, _attention_row(q[b, h, r], keys_k[b, h], values[b, h], visible[b, r], scale))
               for b, h, r in rows):
            b, h, r = rows[0]
            return (f"{place(b, h)}every failing row checked ({len(rows)}, the first row {r}) equals "
                    f"attention over its visible keys where {what}")
    return ""


def _transposed_scores_row(q, k, v, keys: torch.Tensor, r: int, scale: float, tile: int) -> torch.Tensor:
    """Row r of attention whose score for key j is that of query (tile of r) + j % tile against key
    (tile of j) + r % tile: each tile x tile block of the scores transposed (zero rows past the end)."""
    n = k.shape[0]
    size = -(-n // tile) * tile
    q_pad, k_pad = (torch.cat([x, x.new_zeros(size - n, x.shape[-1])]) for x in (q, k))
    j = torch.arange(n)
    scores = (q_pad[r // tile * tile + j % tile] * k_pad[j // tile * tile + r % tile]).sum(-1) * scale
    if not keys.any():
        return torch.zeros_like(v[0])
    return torch.softmax(scores[keys], dim=0) @ v[keys]


def most_values_wrong(got, want, atol: float, rtol: float, tile: int) -> str:
    """More than half the values wrong, and no hypothesis of `explain_attention` fitting (nor a race,
    which a check tests first): a slip that moves whole tiles rather than one row, key or rescale.
    got, want: (..., N, d), rows in query tiles of `tile`."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    bad = ((got - want).abs() > atol + rtol * want.abs()) | got.isnan()
    if float(bad.double().mean()) <= MOSTLY_WRONG:
        return ""
    rows = bad.shape[-2]
    tiles = [i for i in range(0, rows, tile) if bad[..., i:i + tile, :].any()]
    return (f"{int(bad.sum())} of {bad.numel()} values are "
            f"wrong, in {len(tiles)} of {-(-rows // tile)} query tiles, in most rows and columns: not one "
            "row, key or key tile but whole tiles (a tile stored transposed, a stage of loads shifted or "
            "written to the wrong rows, a tile loaded from the wrong array?)")


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
