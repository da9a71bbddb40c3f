"""Notebook 21: a node's siblings drawn without replacement, on the GPU, in one pass (Triton).

Sequoia (Chen et al., 2024, §3.2) draws the k children of a tree node WITHOUT replacement. The
Gumbel top-k trick does it in one pass: give every token v the key log q(v) - log(-log u_v), u_v
uniform in (0, 1), and take the k largest keys in decreasing order: the sequential draws, in
distribution (`pyspec_ref.sampling.gumbel_top_k` is the specification, its docstring the argument).
`sibling_draw_kernel`, one program per node, holds the node's logits row (V <= BLOCK_V: the
capstone's 80 tokens are one block of registers). Input checks: `course.topics.sampling.validate`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from course.core import interpreter
from course.core.launch import poisoned_empty
from course.core.stubs import require_written, todo  # noqa: F401  (the lesson stubs call todo)
from course.topics.sampling import validate as check

MAX_VOCAB = 4096  # one row in registers
TINY = tl.constexpr(2.0 ** -60)  # a uniform of exactly 0 would give an infinite key


@triton.jit
def sibling_draw_kernel(logits, uniforms, tokens, logq, V: tl.constexpr, K: tl.constexpr,
                        BLOCK_V: tl.constexpr):
    """One program per node: tokens[node, :K] the K siblings in draw order (decreasing key) and
    logq[node, :K] their log q (float64)."""
    node = tl.program_id(0)
    offs = tl.arange(0, BLOCK_V)
    live = offs < V
    row = node.to(tl.int64) * V
    x = tl.load(logits + row + offs, mask=live, other=float("-inf")).to(tl.float64)
    u = tl.load(uniforms + row + offs, mask=live, other=0.5)
    ### BEGIN SOLUTION
    # log q: the row's log-softmax in float64, its max subtracted first (padding lanes hold -inf).
    top = tl.max(x, axis=0)
    log_q = x - (top + tl.log(tl.sum(tl.where(live, tl.exp(x - top), 0.0), axis=0)))
    # The Gumbel key of every token; padding lanes can never be drawn.
    keys = tl.where(live, log_q - tl.log(-tl.log(tl.maximum(u, TINY))), float("-inf"))
    for k in tl.static_range(K):
        best = tl.argmax(keys, axis=0, tie_break_left=True)
        tl.store(tokens + node * K + k, best.to(tl.int64))
        tl.store(logq + node * K + k, tl.sum(tl.where(offs == best, log_q, 0.0), axis=0))
        keys = tl.where(offs == best, float("-inf"), keys)  # drawn: never again
    ### END SOLUTION


interpreter.prepare(sibling_draw_kernel)


def draw_siblings(logits: torch.Tensor, uniforms: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k siblings per node without replacement from softmax(logits), by Gumbel keys: (tokens
    (nodes, k) int64 in draw order, their log q (nodes, k) float64). logits: (nodes, V) float;
    uniforms: (nodes, V) float64 in [0, 1), one per token."""
    require_written(sibling_draw_kernel)
    nodes, vocab = check.sibling_draw_args(logits, uniforms, k, MAX_VOCAB)
    logits, uniforms = logits.contiguous(), uniforms.contiguous()
    tokens = poisoned_empty((nodes, k), dtype=torch.int64, device=logits.device)
    logq = poisoned_empty((nodes, k), dtype=torch.float64, device=logits.device)
    sibling_draw_kernel[(nodes,)](logits, uniforms, tokens, logq, V=vocab, K=k,
                                  BLOCK_V=triton.next_power_of_2(vocab))
    return tokens, logq
