"""Notebook 15: speculative sampling in Triton, the seed paper's tiled kernel.

Speculative sampling (Leviathan et al., 2023, Algorithm 1; Chen et al., 2023, Algorithm 2) checks
gamma draft tokens x_c against the target model: x_c is accepted while r_c < min(1, p_c(x_c) /
q_c(x_c)); at the first rejection the emitted token is drawn from the residual max(0, p_c - q_c)
(normalised), and if every draft token is accepted a bonus token is drawn from p_gamma. The
specification is `pyspec_ref.sampling.speculative_sampling`, and this module emits exactly its
tokens from the same random numbers (see "Exactness" below).

The seed paper, "Optimized Speculative Sampling for GPU Hardware Accelerators" (Wagner et al.,
2024), computes the intermediate quantities of that algorithm for every draft position at once,
tile by tile (its Figure 1, Eq. 1-4): tau = min(1, p(x)/q(x)), f = p - q, a = max(0, f) and the
partial sums b_k of a over vocabulary tile k, each tile in one thread block whose intermediate
values never leave the chip. Then (its Figure 2) the partial sums are reduced across tiles and
the residual is sampled. Here:

1. `tile_pass_kernel`, grid (B * (gamma + 1), T) with T = cdiv(V, TILE): program (row, k) reads
   tile k of p_c and q_c once and writes two numbers, the residual's partial sum b_k = sum of
   a = max(0, p - q) over the tile, and the target's partial sum sum(p) (used when the residual
   is empty: p <= q everywhere, as when p == q). Row c = gamma (the bonus position) has no q: its
   "residual" is p itself. The program of tile 0 also decides the acceptance test of position c.
   tau is used only through the test r < tau, written r * q(x) < p(x): no division, and a
   draft token with q(x) = 0 < p(x) is accepted, as in the specification. Strict, because r lies
   in [0, 1): r = 0 must not accept a token with p(x) = 0 (`pyspec_ref.sampling` says why).
2. `resample_kernel`, one program per batch entry: the first rejected position c* (or gamma), then
   the inverse CDF of that row's weights by tiles: `first_crossing` on the T partial sums finds
   the tile where the cumulative sum crosses u * total, then `first_crossing` on that one tile's
   weights (re-read: TILE values) finds the token. The draw reads 2 * TILE values, not V.

From logits the softmax is fused: `softmax_stats_kernel` (same grid) writes each tile's maximum
and sum of exponentials; the other two kernels combine a row's T pairs into the row's (max, sum)
and compute p = exp(z - max) / sum as they load a tile. Probabilities are never written.

The sigmoid approximation (the seed paper's Eq. 5) replaces the softmax by an element-wise
sigmoid, so that a weight needs no row-wide max or sum; see `sigmoid_speculative_sampling`.

Exactness. The acceptance test is computed in float64 from float32 r, q(x), p(x): a product of two
float32 numbers is exact in float64, so the test is bit for bit the specification's (which
computes it in Python floats, i.e. float64). The inverse CDF sums float32 weights in float32, by
tiles; pyspec sums them exactly. A draw can therefore differ only where u * total lies within the
float32 rounding error of a CDF boundary (at most about V * 2^-24 * total); the checks detect and
count those draws. Weights that are exactly zero are never drawn, whatever the rounding.

Reusable pieces (notebook 16's tree verification builds on them): `first_crossing` (one level of
the inverse CDF by tiles), `load_weights` (a tile of probabilities, of softmax(logits) from a
row's statistics, or of sigmoid(logits)), `row_softmax_stats` (a row's max and sum of
exponentials from per-tile pairs), `tile_pass_kernel` (the residual's partial sums).

Inputs: float32 probabilities or logits (finite; a masked token gets a very negative logit such
as torch.finfo(torch.float32).min, not -inf), int32 or int64 draft tokens, float32 uniforms in
[0, 1). Outputs: accepted (B,) int32 and emitted (B, gamma + 1) in the draft tokens' dtype,
padded with -1 after the last emitted token (`pyspec_ref.sampling.PAD`).

Input checks live in `course.topics.sampling.validate`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from course.core import interpreter, runtime
from course.core.launch import poisoned_empty
from course.core.stubs import require_written, todo  # noqa: F401  (the lesson stubs call todo)
from course.topics.sampling import validate as check

TILE_GPU, TILE_SIM = 2048, 32  # vocabulary entries per program (powers of two)
TILE = runtime.pick(sim=TILE_SIM, gpu=TILE_GPU)
NUM_WARPS = 4
PAD = -1  # pads the emitted rows after the last emitted token (pyspec_ref.sampling.PAD)
PAD_ID = tl.constexpr(PAD)  # the same, as a constant the kernels can read

# What the probability tensors hold (a compile-time constant of the kernels).
PROBABILITIES = tl.constexpr(0)  # probabilities, used as given
SOFTMAX = tl.constexpr(1)  # logits; weights = softmax(logits), fused
SIGMOID = tl.constexpr(2)  # logits; weights = sigmoid(alpha * logits + beta) (the seed paper's Eq. 5)
FORMS = {"probs": 0, "logits": 1, "sigmoid": 2}




# --------------------------------------------------------------------------- building blocks


@triton.jit
def row_softmax_stats(tile_max, tile_sum, row, T, TILES_BLOCK: tl.constexpr):
    """(m, l) of one row from its T per-tile pairs (stored at row * T + k): m = max over the row,
    l = sum over the row of exp(z - m) = sum_k l_k * exp(m_k - m). Every program of a row that
    calls this gets the same two numbers, bit for bit."""
    ks = tl.arange(0, TILES_BLOCK)
    inside = ks < T
    m_k = tl.load(tile_max + row * T + ks, mask=inside, other=float("-inf"))
    l_k = tl.load(tile_sum + row * T + ks, mask=inside, other=0.0)
    m = tl.max(m_k, axis=0)
    return m, tl.sum(tl.where(inside, l_k * tl.exp(m_k - m), 0.0), axis=0)


@triton.jit
def load_weights(ptr, row, V, idx, inside, m, l, alpha, beta, FORM: tl.constexpr):
    """Entries idx of row `row` of a contiguous (rows, V) float32 tensor, as probabilities:
    as given (PROBABILITIES), exp(z - m) / l (SOFTMAX, with the row's statistics m, l) or
    sigmoid(alpha * z + beta) (SIGMOID). 0 where `inside` is false. idx may be a block or a scalar."""
    offsets = row.to(tl.int64) * V + idx
    if FORM == PROBABILITIES:
        w = tl.load(ptr + offsets, mask=inside, other=0.0)
    elif FORM == SOFTMAX:
        z = tl.load(ptr + offsets, mask=inside, other=0.0)
        w = tl.exp(z - m) / l
    else:
        z = tl.load(ptr + offsets, mask=inside, other=0.0)
        w = tl.sigmoid(alpha * z + beta)
    return tl.where(inside, w, 0.0)


@triton.jit
def first_crossing(weights, offset, threshold, BLOCK: tl.constexpr):
    """One level of the inverse CDF: (j, before) for a block of BLOCK non-negative weights.

    j is the smallest index with offset + w_0 + ... + w_j > threshold and w_j > 0 (the token, or
    the tile, that the draw u lands in when threshold = u * total); when rounding leaves no such
    index (threshold at or past the block's float32 total), the last index with w_j > 0.
    before = offset + w_0 + ... + w_{j-1}, the cumulative weight in front of j: the offset of the
    next level's search. A zero weight is never chosen; a block with no positive weight gives
    j = -1 (only a row of sigmoid weights that all underflow: the resample kernel emits PAD).
    """
    ### BEGIN SOLUTION
    positions = tl.arange(0, BLOCK)
    cumulative = offset + tl.cumsum(weights, axis=0)
    positive = weights > 0.0
    crossed = (cumulative > threshold) & positive
    first = tl.min(tl.where(crossed, positions, BLOCK), axis=0)
    last_positive = tl.max(tl.where(positive, positions, -1), axis=0)
    j = tl.where(first < BLOCK, first, last_positive)
    before = tl.sum(tl.where(positions == j, cumulative - weights, 0.0), axis=0)
    ### END SOLUTION
    return j, before


# --------------------------------------------------------------------------- the kernels


@triton.jit
def softmax_stats_kernel(P, Q, p_max, p_sum, q_max, q_sum, V, T, GAMMA, TILE: tl.constexpr):
    """From logits: each tile's max and sum of exp(z - max), for p (every row) and q (rows c < gamma);
    stored at (b * (gamma + 1) + c) * T + k, the layout `row_softmax_stats` reads."""
    row = tl.program_id(0)
    k = tl.program_id(1)
    b = row // (GAMMA + 1)
    c = row % (GAMMA + 1)
    idx = k * TILE + tl.arange(0, TILE)
    inside = idx < V  # tile k < T holds at least one entry, so the max is finite
    z = tl.load(P + row.to(tl.int64) * V + idx, mask=inside, other=float("-inf"))
    m = tl.max(z, axis=0)
    tl.store(p_max + row * T + k, m)
    tl.store(p_sum + row * T + k, tl.sum(tl.exp(z - m), axis=0))
    if c < GAMMA:
        y = tl.load(Q + (b * GAMMA + c).to(tl.int64) * V + idx, mask=inside, other=float("-inf"))
        m_q = tl.max(y, axis=0)
        tl.store(q_max + row * T + k, m_q)
        tl.store(q_sum + row * T + k, tl.sum(tl.exp(y - m_q), axis=0))


@triton.jit
def tile_pass_kernel(X, P, Q, R, accept, residual_sums, target_sums, p_max, p_sum, q_max, q_sum,
                     V, T, GAMMA, alpha, beta, FORM: tl.constexpr, TILE: tl.constexpr,
                     TILES_BLOCK: tl.constexpr):
    """Program (row, k), row = b * (gamma + 1) + c: the seed paper's per-tile pass (Figure 1).

    Writes residual_sums[row, k] = b_k = sum over tile k of a = max(0, f), f = p_c - q_c (for the
    bonus row c = gamma, q is 0 and a = p), target_sums[row, k] = sum over tile k of p_c, and, in
    the program of tile 0 of a row c < gamma, accept[b, c] = 1 if r_c * q_c(x_c) < p_c(x_c)
    (the test r < tau, tau = min(1, p/q)), computed in float64 (exact for float32 inputs).
    """
    row = tl.program_id(0)
    k = tl.program_id(1)
    b = row // (GAMMA + 1)
    c = row % (GAMMA + 1)
    has_draft = c < GAMMA
    q_row = b * GAMMA + c
    m_p, l_p, m_q, l_q = 0.0, 1.0, 0.0, 1.0
    if FORM == SOFTMAX:
        m_p, l_p = row_softmax_stats(p_max, p_sum, row, T, TILES_BLOCK)
        m_q, l_q = row_softmax_stats(q_max, q_sum, row, T, TILES_BLOCK)
    idx = k * TILE + tl.arange(0, TILE)
    inside = idx < V  # the last tile is ragged when V is not a multiple of TILE
    p = load_weights(P, row, V, idx, inside, m_p, l_p, alpha, beta, FORM)
    q = load_weights(Q, q_row, V, idx, inside & has_draft, m_q, l_q, alpha, beta, FORM)
    ### BEGIN SOLUTION
    f = p - q
    a = tl.maximum(f, 0.0)
    tl.store(residual_sums + row * T + k, tl.sum(a, axis=0))
    tl.store(target_sums + row * T + k, tl.sum(p, axis=0))
    if has_draft & (k == 0):
        x = tl.load(X + q_row)
        p_x = load_weights(P, row, V, x, x < V, m_p, l_p, alpha, beta, FORM)
        q_x = load_weights(Q, q_row, V, x, x < V, m_q, l_q, alpha, beta, FORM)
        r = tl.load(R + q_row)
        test = r.to(tl.float64) * q_x.to(tl.float64) < p_x.to(tl.float64)
        tl.store(accept + q_row, test.to(tl.int8))
    ### END SOLUTION


@triton.jit
def resample_kernel(X, P, Q, U, accept, residual_sums, target_sums, p_max, p_sum, q_max, q_sum,
                    accepted, emitted, V, T, GAMMA, alpha, beta, FORM: tl.constexpr, TILE: tl.constexpr,
                    TILES_BLOCK: tl.constexpr, GAMMA_BLOCK: tl.constexpr):
    """Program b (the seed paper's Figure 2): the first rejected position c* (gamma if none), then a
    draw from row c*'s residual (p itself if the residual is empty, or at c* = gamma) by the
    inverse CDF in two levels: the tile, from the partial sums; the token, from that tile."""
    b = tl.program_id(0)
    cs = tl.arange(0, GAMMA_BLOCK)
    flags = tl.load(accept + b * GAMMA + cs, mask=cs < GAMMA, other=1)
    first = tl.min(tl.where((flags == 0) & (cs < GAMMA), cs, GAMMA), axis=0)
    row = b * (GAMMA + 1) + first
    u = tl.load(U + row)
    ks = tl.arange(0, TILES_BLOCK)
    residual = tl.load(residual_sums + row * T + ks, mask=ks < T, other=0.0)
    # A sum of non-negative float32 numbers is 0 exactly when every one is: p <= q everywhere.
    empty = tl.sum(residual, axis=0) == 0.0
    sums = tl.where(empty, tl.load(target_sums + row * T + ks, mask=ks < T, other=0.0), residual)
    threshold = u * tl.sum(sums, axis=0)
    k, before = first_crossing(sums, 0.0, threshold, TILES_BLOCK)
    # No positive weight in the row (only a sigmoid whose every weight underflows): no token.
    nothing = k < 0
    k = tl.maximum(k, 0)
    # The one tile the draw lands in, its weights computed again exactly as the tile pass did.
    m_p, l_p, m_q, l_q = 0.0, 1.0, 0.0, 1.0
    if FORM == SOFTMAX:
        m_p, l_p = row_softmax_stats(p_max, p_sum, row, T, TILES_BLOCK)
        m_q, l_q = row_softmax_stats(q_max, q_sum, row, T, TILES_BLOCK)
    idx = k * TILE + tl.arange(0, TILE)
    inside = idx < V
    p = load_weights(P, row, V, idx, inside, m_p, l_p, alpha, beta, FORM)
    q = load_weights(Q, b * GAMMA + first, V, idx, inside & (first < GAMMA), m_q, l_q, alpha, beta, FORM)
    weights = tl.where(empty, p, tl.maximum(p - q, 0.0))
    j, _ = first_crossing(weights, before, threshold, TILE)
    token = tl.where(nothing | (j < 0), PAD_ID, k * TILE + j)
    tl.store(accepted + b, first)
    draft = tl.load(X + b * GAMMA + cs, mask=cs < GAMMA, other=0)
    out = tl.where(cs < first, draft, tl.where(cs == first, token, PAD_ID))
    tl.store(emitted + b * (GAMMA + 1) + cs, out.to(emitted.dtype.element_ty), mask=cs <= GAMMA)


interpreter.prepare(row_softmax_stats, load_weights, first_crossing, softmax_stats_kernel,
                    tile_pass_kernel, resample_kernel)


# --------------------------------------------------------------------------- launchers


def _block(n: int) -> int:
    return triton.next_power_of_2(max(n, 1))


class _Buffers:
    """The intermediate tensors of one problem size, allocated once."""

    def __init__(self, batch: int, gamma: int, tiles: int, device, token_dtype) -> None:
        rows = (batch, gamma + 1, tiles)
        self.accept = poisoned_empty((batch, gamma), dtype=torch.int8, device=device)
        self.residual_sums = poisoned_empty(rows, dtype=torch.float32, device=device)
        self.target_sums = poisoned_empty(rows, dtype=torch.float32, device=device)
        # Softmax statistics (from logits only); the bonus row has no q, whose (max, sum) stay (0, 1).
        self.p_max, self.q_max = (torch.zeros(rows, dtype=torch.float32, device=device) for _ in range(2))
        self.p_sum, self.q_sum = (torch.ones(rows, dtype=torch.float32, device=device) for _ in range(2))
        self.accepted = poisoned_empty(batch, dtype=torch.int32, device=device)
        self.emitted = poisoned_empty((batch, gamma + 1), dtype=token_dtype, device=device)


def prepare_sampling(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                     accept_uniforms: torch.Tensor, sample_uniforms: torch.Tensor, *, form: str = "probs",
                     alpha: float = 1.0, beta: float = 0.0,
                     tile: int | None = None) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """Check the inputs once and return a function that launches the kernels alone (for timing):
    it returns (accepted, emitted), tensors it reuses on every call.

    form: "probs" (q, p are probabilities), "logits" (softmax of logits, fused) or "sigmoid"
    (sigmoid(alpha * logits + beta), the seed paper's Eq. 5). The function also has `.tile_pass()`,
    which runs the kernels up to the per-tile pass and returns (accept, residual_sums, target_sums);
    with sample_uniforms=None only that one is available.
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {tuple(FORMS)}, got {form!r}")
    require_written(softmax_stats_kernel, tile_pass_kernel)
    if sample_uniforms is not None:  # the draw too (sample_uniforms None: the tile pass alone)
        require_written(first_crossing, resample_kernel)
    tile = TILE if tile is None else tile
    batch, gamma, vocabulary, tile = check.sampling_inputs(draft_tokens, q, p, accept_uniforms,
                                                           sample_uniforms, form, tile, alpha, beta)
    tiles = triton.cdiv(vocabulary, tile)
    tiles_block, gamma_block = _block(tiles), _block(gamma + 1)
    buffers = _Buffers(batch, gamma, tiles, q.device, draft_tokens.dtype)
    constants = dict(FORM=FORMS[form], TILE=tile, TILES_BLOCK=tiles_block)
    stats = (buffers.p_max, buffers.p_sum, buffers.q_max, buffers.q_sum)
    grid = (batch * (gamma + 1), tiles)
    alpha, beta = float(alpha), float(beta)

    def tile_pass():
        if form == "logits":
            softmax_stats_kernel[grid](p, q, *stats, vocabulary, tiles, gamma, TILE=tile, num_warps=NUM_WARPS)
        tile_pass_kernel[grid](draft_tokens, p, q, accept_uniforms, buffers.accept, buffers.residual_sums,
                               buffers.target_sums, *stats, vocabulary, tiles, gamma, alpha, beta,
                               **constants, num_warps=NUM_WARPS)
        return buffers.accept.bool(), buffers.residual_sums, buffers.target_sums

    def run():
        if sample_uniforms is None:
            raise ValueError("sample_uniforms is None: this function runs the tile pass alone (.tile_pass())")
        tile_pass()
        resample_kernel[(batch,)](draft_tokens, p, q, sample_uniforms, buffers.accept, buffers.residual_sums,
                                  buffers.target_sums, *stats, buffers.accepted, buffers.emitted,
                                  vocabulary, tiles, gamma, alpha, beta, **constants,
                                  GAMMA_BLOCK=gamma_block, num_warps=NUM_WARPS)
        return buffers.accepted, buffers.emitted

    run.tile_pass = tile_pass
    return run


def speculative_sampling(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                         accept_uniforms: torch.Tensor, sample_uniforms: torch.Tensor, *,
                         from_logits: bool = False, tile: int | None = None):
    """(accepted (B,) int32, emitted (B, gamma + 1)) for draft_tokens (B, gamma), draft distributions
    q (B, gamma, V), target distributions p (B, gamma + 1, V) and uniforms (B, gamma), (B, gamma + 1):
    `pyspec_ref.sampling.speculative_sampling_batch` on a GPU. With from_logits=True, q and p are
    logits and the softmax is fused into the kernels."""
    if not isinstance(from_logits, bool):
        raise TypeError(f"from_logits must be a bool, got {type(from_logits).__name__}")
    accepted, emitted = prepare_sampling(draft_tokens, q, p, accept_uniforms, sample_uniforms,
                                         form="logits" if from_logits else "probs", tile=tile)()
    return accepted.clone(), emitted.clone()


def sigmoid_speculative_sampling(draft_tokens: torch.Tensor, q_logits: torch.Tensor, p_logits: torch.Tensor,
                                 accept_uniforms: torch.Tensor, sample_uniforms: torch.Tensor, *,
                                 alpha: float = 1.0, beta: float = 0.0, tile: int | None = None):
    """The seed paper's approximation (its Eq. 5), fused on logits: every softmax of the algorithm
    is replaced by the element-wise sigmoid of affinely scaled logits,

        p~_i = sigmoid(alpha * z_i + beta) = 1 / (1 + exp(-(alpha * z_i + beta))),

    with the same alpha, beta for the draft logits (q~) and the target logits (p~). Then x_c is
    accepted if r_c * q~_c(x_c) < p~_c(x_c); the resample is the inverse CDF of max(0, p~_c - q~_c)
    (of p~_c if that is empty), normalised by its own sum; the bonus token is drawn from p~_gamma.
    No weight needs a row-wide max or sum, so the softmax statistics pass disappears. With
    beta = -log(sum_i exp(alpha * z_i)) a token of small probability gets about softmax's weight,
    but one constant beta cannot match every row: the emitted tokens no longer follow p exactly
    (`course.topics.sampling.bench.sigmoid_quality` measures how far). Same shapes and outputs as
    `speculative_sampling`, except that a row whose every weight underflows to 0 (beta far too
    negative) has no token to draw: its draw is emitted as PAD."""
    check.logits_pair(q_logits, p_logits)  # named as this function names them
    accepted, emitted = prepare_sampling(draft_tokens, q_logits, p_logits, accept_uniforms, sample_uniforms,
                                         form="sigmoid", alpha=alpha, beta=beta, tile=tile)()
    return accepted.clone(), emitted.clone()


def tile_pass(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, accept_uniforms: torch.Tensor,
              *, from_logits: bool = False, tile: int | None = None):
    """The per-tile pass alone: (accept (B, gamma) bool, residual_sums (B, gamma + 1, T),
    target_sums (B, gamma + 1, T)) float32, T = cdiv(V, tile): residual_sums[b, c, k] is the sum of
    max(0, p - q) over tile k of position c (of p at c = gamma), target_sums[b, c, k] that of p."""
    if not isinstance(from_logits, bool):
        raise TypeError(f"from_logits must be a bool, got {type(from_logits).__name__}")
    run = prepare_sampling(draft_tokens, q, p, accept_uniforms, None,
                           form="logits" if from_logits else "probs", tile=tile)
    return tuple(t.clone() for t in run.tile_pass())
