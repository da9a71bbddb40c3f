"""Single-head attention, written the way the papers' equations read.

Matrices are lists of rows of Python floats: q is N x d (one row per query),
k is M x d and v is M x dv (one row per key). A mask is an N x M list of rows
of bools, True = the query may see the key. Scores are scaled by
``scale = 1/sqrt(d)`` unless given. ``lse`` is always the natural log of the
sum of exp(scaled score) over the visible keys of a row.

Sums use `math.fsum` (correctly rounded), so that these functions are the
accurate side of any comparison with a GPU kernel.
"""

from __future__ import annotations

import math

from ._validate import (
    as_sequence,
    bool_matrix,
    positive_finite,
    positive_int,
    real_list,
    real_matrix,
)
from .trees import tree_mask_from_times, validate_times

__all__ = [
    "attention",
    "attention_with_lse",
    "flash_attention",
    "merge_attention",
    "online_softmax",
    "online_softmax_stats",
    "scores",
    "softmax",
    "tree_attention",
]

NEG_INF = -math.inf
Matrix = list[list[float]]


# --------------------------------------------------------------------------- validation


def _qk(q: object, k: object) -> tuple[Matrix, Matrix]:
    """q (N x d) and k (M x d) as float matrices with the same width d."""
    Q = real_matrix(q, "q")
    d = len(Q[0])
    K = real_matrix(k, "k", n_cols=d, cols_note=f"d = {d} (the width of q)")
    return Q, K


def _qkv(q: object, k: object, v: object) -> tuple[Matrix, Matrix, Matrix]:
    """q, k as in `_qk`, and v (M x dv) with one row per key."""
    Q, K = _qk(q, k)
    V = real_matrix(v, "v", n_rows=len(K), rows_note=f"M = {len(K)} (the number of rows of k)")
    return Q, K, V


def _scale(scale: object, d: int) -> float:
    """The softmax scale: 1/sqrt(d) by default (Vaswani et al., 2017 Eq. 1)."""
    return 1.0 / math.sqrt(d) if scale is None else positive_finite(scale, "scale")


def _mask(mask: object, n: int, m: int) -> list[list[bool]]:
    """The N x M mask (all visible if None); every query row must see a key.

    A row with no visible key has an empty softmax (0/0): refusing it here is
    what keeps every function in this module from returning NaN silently.
    """
    if mask is None:
        return [[True] * m for _ in range(n)]
    rows = bool_matrix(
        mask,
        "mask",
        n_rows=n,
        rows_note=f"N = {n} (the number of rows of q)",
        n_cols=m,
        cols_note=f"M = {m} (the number of rows of k)",
    )
    for i, row in enumerate(rows):
        if not any(row):
            raise ValueError(
                f"mask[{i}] has no True entry: query row {i} sees no key, "
                "so its softmax is undefined"
            )
    return rows


def _dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


# --------------------------------------------------------------------------- scores, softmax


def scores(q: object, k: object, scale: object = None) -> Matrix:
    """S = scale * Q K^T, an N x M matrix (Vaswani et al., 2017 §3.2.1, Eq. 1).

    S[i][j] = scale * sum_c q[i][c] * k[j][c]; scale defaults to 1/sqrt(d).
    """
    Q, K = _qk(q, k)
    s = _scale(scale, len(Q[0]))
    return [[s * _dot(qi, kj) for kj in K] for qi in Q]


def softmax(row: object) -> list[float]:
    """Numerically stable softmax: exp(x_j - max x) / sum_i exp(x_i - max x).

    Milakov & Gimelshein (2018), Algorithm 2 ("safe softmax"). Entries of -inf
    (masked) get probability 0; a row of only -inf has no softmax (ValueError).
    """
    x = real_list(row, "row", allow_neg_inf=True)
    m = max(x)
    if m == NEG_INF:
        raise ValueError("row is all -inf: a softmax needs at least one finite entry")
    e = [0.0 if xi == NEG_INF else math.exp(xi - m) for xi in x]
    total = math.fsum(e)
    return [ei / total for ei in e]


def online_softmax_stats(row: object, block: object = 1) -> tuple[float, float]:
    """(m, l): the running max and normaliser after one streaming pass over `row`.

    Online normalizer calculation for softmax (Milakov & Gimelshein, 2018)
    Algorithm 3, processing `block` entries at a time: m_new = max(m, max
    block), l = l * exp(m - m_new) + sum_block exp(x - m_new). Then
    m + log(l) is the row's log-sum-exp. A row of only -inf gives (-inf, 0.0),
    the statistics of an empty sum (callers such as `online_softmax` refuse it).
    """
    x = real_list(row, "row", allow_neg_inf=True)
    b = positive_int(block, "block")
    m, l = NEG_INF, 0.0
    for j0 in range(0, len(x), b):
        m, l = _online_step(m, l, x[j0 : j0 + b])
    return m, l


def _online_step(m: float, l: float, xs: list[float]) -> tuple[float, float]:
    """Fold one block into (m, l), never forming exp(-inf - -inf) = exp(nan)."""
    m_new = max(m, max(xs))
    if m_new == NEG_INF:
        return m, l  # nothing finite seen yet: the block adds exp(-inf) = 0
    rescale = 0.0 if m == NEG_INF else math.exp(m - m_new)  # l is 0 while m is -inf
    added = math.fsum(math.exp(xi - m_new) for xi in xs if xi != NEG_INF)
    return m_new, l * rescale + added


def online_softmax(row: object, block: object = 1) -> list[float]:
    """Softmax by the online normaliser (Milakov & Gimelshein, 2018, Algorithm 3).

    Pass 1 streams over blocks keeping (m, l) (see `online_softmax_stats`);
    pass 2 normalises: y_j = exp(x_j - m) / l. Equals `softmax` for any block.
    """
    x = real_list(row, "row", allow_neg_inf=True)
    m, l = online_softmax_stats(x, block)
    if m == NEG_INF:
        raise ValueError("row is all -inf: a softmax needs at least one finite entry")
    return [0.0 if xi == NEG_INF else math.exp(xi - m) / l for xi in x]


# --------------------------------------------------------------------------- attention


def attention_with_lse(
    q: object, k: object, v: object, mask: object = None, scale: object = None
) -> tuple[Matrix, list[float]]:
    """Naive masked attention and the row log-sum-exp (Vaswani et al., 2017 Eq. 1).

    out[i] = sum_j P[i][j] v[j] with P[i] = softmax over the visible j of
    S[i][j] = scale * q[i].k[j]; lse[i] = log(sum_{j visible} exp(S[i][j])).
    The lse is what FlashAttention-2 (Dao, 2023) stores for the backward pass
    and what Flash-Decoding merges partial results by.
    """
    Q, K, V = _qkv(q, k, v)
    vis = _mask(mask, len(Q), len(K))
    s = _scale(scale, len(Q[0]))
    out: Matrix = []
    lse: list[float] = []
    for i, qi in enumerate(Q):
        js = [j for j in range(len(K)) if vis[i][j]]
        row = [s * _dot(qi, K[j]) for j in js]
        m = max(row)
        e = [math.exp(x - m) for x in row]
        total = math.fsum(e)
        out.append(
            [math.fsum(e[t] * V[j][c] for t, j in enumerate(js)) / total for c in range(len(V[0]))]
        )
        lse.append(m + math.log(total))
    return out, lse


def attention(q: object, k: object, v: object, mask: object = None, scale: object = None) -> Matrix:
    """softmax(scale * Q K^T, masked) V (Vaswani et al., 2017 §3.2.1, Eq. 1).

    The output of `attention_with_lse`; True in `mask` = visible.
    """
    return attention_with_lse(q, k, v, mask, scale)[0]


def flash_attention(
    q: object,
    k: object,
    v: object,
    mask: object = None,
    scale: object = None,
    block_q: object = 32,
    block_k: object = 32,
) -> tuple[Matrix, list[float]]:
    """Tiled attention forward pass: FlashAttention-2 (Dao, 2023) Algorithm 1.

    For each tile of `block_q` query rows, stream over tiles of `block_k` keys
    keeping per row a running max m, sum l and unnormalised accumulator acc;
    a new tile with max m_tile rescales l and acc by exp(m - m_new). Output
    out = acc / l and lse = m + log(l) once all key tiles are done. Equal to
    `attention_with_lse` for any block sizes >= 1.
    """
    Q, K, V = _qkv(q, k, v)
    vis = _mask(mask, len(Q), len(K))
    s = _scale(scale, len(Q[0]))
    bq = positive_int(block_q, "block_q")
    bk = positive_int(block_k, "block_k")
    out: Matrix = []
    lse: list[float] = []
    for i0 in range(0, len(Q), bq):
        rows = range(i0, min(i0 + bq, len(Q)))
        m = {i: NEG_INF for i in rows}
        l = {i: 0.0 for i in rows}
        acc = {i: [0.0] * len(V[0]) for i in rows}
        for j0 in range(0, len(K), bk):
            cols = range(j0, min(j0 + bk, len(K)))
            for i in rows:
                tile = [s * _dot(Q[i], K[j]) if vis[i][j] else NEG_INF for j in cols]
                m[i], l[i], acc[i] = _flash_step(m[i], l[i], acc[i], tile, [V[j] for j in cols])
        for i in rows:  # _mask guarantees every row saw a key, so l[i] > 0
            out.append([a / l[i] for a in acc[i]])
            lse.append(m[i] + math.log(l[i]))
    return out, lse


def _flash_step(
    m: float, l: float, acc: list[float], tile: list[float], v_tile: Matrix
) -> tuple[float, float, list[float]]:
    """Fold one key tile into a row's (m, l, acc) (FlashAttention-2 Algorithm 1, inner loop).

    A fully masked tile (all -inf) contributes nothing and is skipped, so
    exp(-inf - -inf) is never formed.
    """
    m_tile = max(tile)
    if m_tile == NEG_INF:
        return m, l, acc
    m_new = max(m, m_tile)
    rescale = 0.0 if m == NEG_INF else math.exp(m - m_new)  # l, acc are 0 while m is -inf
    p = [0.0 if x == NEG_INF else math.exp(x - m_new) for x in tile]
    l_new = l * rescale + math.fsum(p)
    acc_new = [
        a * rescale + math.fsum(pj * vj[c] for pj, vj in zip(p, v_tile, strict=True))
        for c, a in enumerate(acc)
    ]
    return m_new, l_new, acc_new


def merge_attention(outs: object, lses: object) -> tuple[list[float], float]:
    """Merge partial attention results of ONE query row over disjoint key sets.

    Flash-Decoding (Dao et al., 2023) reduction, reused by DeFT (Yao et al.,
    ICLR 2025) §3.4 "tree-topology-aware global reduction":
    lse = log(sum_p exp(lse_p)) and out = sum_p exp(lse_p - lse) * out_p,
    computed around max_p lse_p for stability. A partial with lse_p = -inf saw
    no key and contributes nothing (its out_p may be anything, even NaN).
    """
    ls = real_list(lses, "lses", allow_neg_inf=True)
    rows = as_sequence(outs, "outs", "a list of partial output rows, one per entry of lses")
    if len(rows) != len(ls):
        raise ValueError(f"outs has {len(rows)} rows but lses has {len(ls)}: one per partial")
    m = max(ls)
    if m == NEG_INF:
        raise ValueError("lses are all -inf: no partial saw a key, so the merge is undefined")
    dv = len(as_sequence(rows[0], "outs[0]", "a row of real numbers"))
    parts = [
        real_list(
            r,
            f"outs[{p}]",
            any_value=ls[p] == NEG_INF,
            expected_len=dv,
            len_note=f"dv = {dv} (the length of outs[0])",
        )
        for p, r in enumerate(rows)
    ]
    live = [p for p in range(len(ls)) if ls[p] != NEG_INF]
    e = {p: math.exp(ls[p] - m) for p in live}  # in (0, 1]: no overflow
    total = math.fsum(e.values())
    # exp(lse_p - lse) = e_p / total; dividing by total is more exact than
    # subtracting the rounded lse, whose last bit is coarse when |lse| is large
    out = [math.fsum(e[p] * parts[p][c] for p in live) / total for c in range(dv)]
    return out, m + math.log(total)


def tree_attention(
    q: object, k: object, v: object, start: object, end: object, scale: object = None
) -> tuple[Matrix, list[float]]:
    """Tree attention over N tree nodes with the DFS-interval mask (FlashSpecInfer §5).

    `attention_with_lse` with mask = tree_mask_from_times(start, end): queries
    and keys are the same N token-tree nodes, and node q sees node k iff k is
    an ancestor of q or q itself (FlashSpecInfer §5.1 interval test).
    """
    s, e = validate_times(start, end)
    n = len(s)
    note = f"N = {n} (the number of tree nodes in start/end)"
    Q = real_matrix(q, "q", n_rows=n, rows_note=note)
    real_matrix(k, "k", n_rows=n, rows_note=note)
    return attention_with_lse(Q, k, v, tree_mask_from_times(s, e), scale)
