"""Notebook 15's launchers: the seed paper's kernels launched in order, into buffers allocated once.

The kernels (Wagner et al., 2024, "Optimized Speculative Sampling for GPU Hardware Accelerators"):
1. from logits only, `softmax_stats_kernel` (given: course/topics/sampling/kernels.py), grid
   (B * (gamma + 1), T), T = cdiv(V, tile): each tile's max and sum of exponentials;
2. your `tile_pass_kernel`, the same grid: each tile's partial sums b_k of max(0, p - q) and of p,
   and, in the program of tile 0, position c's acceptance test (the paper's Figure 1);
3. your `resample_kernel`, one program per batch entry: the first rejected position and the draw
   from its residual by the inverse CDF in two levels, `first_crossing` over the T partial sums,
   then over the one tile it lands in (the paper's Figure 2): 2 * tile values read, not V.

`kernels` is whatever holds those three: the module `course.core.impl.load("spec_sampling")`
gives (your lessons/ copy or solutions/), or `SamplingKernels(...)` of them, as the plain
launchers in lessons/spec_sampling.py pass their own.

Exactness. The acceptance test is computed in float64 from float32 r, q(x), p(x): a product of two
float32 numbers is exact in float64, so the test is bit for bit the specification's. The inverse
CDF sums float32 weights in float32, by tiles; pyspec sums them exactly. A draw can therefore
differ only where u * total lies within the float32 rounding error of a CDF boundary (at most about
V * 2^-24 * total); the checks detect and count those draws. A weight of exactly zero is never drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from course.core import runtime
from course.core.launch import poisoned_empty
from course.core.stubs import require_written
from course.topics.sampling import validate as check
from course.topics.sampling.kernels import FORMS, softmax_stats_kernel

TILE_GPU, TILE_SIM = 2048, 32  # vocabulary entries per program (powers of two)
TILE = runtime.pick(sim=TILE_SIM, gpu=TILE_GPU)
NUM_WARPS = 4


@dataclass(frozen=True)
class SamplingKernels:
    """The three kernels of one implementation that a launch runs (a module holding them does too)."""

    tile_pass_kernel: object
    first_crossing: object
    resample_kernel: object


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


def prepare_sampling(kernels, draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                     accept_uniforms: torch.Tensor, sample_uniforms: torch.Tensor | None, *,
                     form: str = "probs", alpha: float = 1.0, beta: float = 0.0,
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
    require_written(kernels.tile_pass_kernel)
    if sample_uniforms is not None:  # the draw too (sample_uniforms None: the tile pass alone)
        require_written(kernels.first_crossing, kernels.resample_kernel)
    tile = TILE if tile is None else tile
    batch, gamma, vocabulary, tile = check.sampling_inputs(draft_tokens, q, p, accept_uniforms,
                                                           sample_uniforms, form, tile, alpha, beta)
    tiles = triton.cdiv(vocabulary, tile)
    buffers = _Buffers(batch, gamma, tiles, q.device, draft_tokens.dtype)
    constants = dict(FORM=FORMS[form], TILE=tile, TILES_BLOCK=_block(tiles))
    stats = (buffers.p_max, buffers.p_sum, buffers.q_max, buffers.q_sum)
    grid = (batch * (gamma + 1), tiles)
    alpha, beta = float(alpha), float(beta)

    def tile_pass():
        if form == "logits":
            softmax_stats_kernel[grid](p, q, *stats, vocabulary, tiles, gamma, TILE=tile, num_warps=NUM_WARPS)
        kernels.tile_pass_kernel[grid](draft_tokens, p, q, accept_uniforms, buffers.accept,
                                       buffers.residual_sums, buffers.target_sums, *stats, vocabulary,
                                       tiles, gamma, alpha, beta, **constants, num_warps=NUM_WARPS)
        return buffers.accept.bool(), buffers.residual_sums, buffers.target_sums

    def run():
        if sample_uniforms is None:
            raise ValueError("sample_uniforms is None: this function runs the tile pass alone (.tile_pass())")
        tile_pass()
        kernels.resample_kernel[(batch,)](draft_tokens, p, q, sample_uniforms, buffers.accept,
                                          buffers.residual_sums, buffers.target_sums, *stats,
                                          buffers.accepted, buffers.emitted, vocabulary, tiles, gamma,
                                          alpha, beta, **constants, GAMMA_BLOCK=_block(gamma + 1),
                                          num_warps=NUM_WARPS)
        return buffers.accepted, buffers.emitted

    run.tile_pass = tile_pass
    return run


def sigmoid_speculative_sampling(kernels, draft_tokens: torch.Tensor, q_logits: torch.Tensor,
                                 p_logits: torch.Tensor, accept_uniforms: torch.Tensor,
                                 sample_uniforms: torch.Tensor, *, alpha: float = 1.0, beta: float = 0.0,
                                 tile: int | None = None):
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
    accepted, emitted = prepare_sampling(kernels, draft_tokens, q_logits, p_logits, accept_uniforms,
                                         sample_uniforms, form="sigmoid", alpha=alpha, beta=beta, tile=tile)()
    return accepted.clone(), emitted.clone()
