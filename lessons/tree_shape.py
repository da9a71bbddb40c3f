# Student copy, generated from solutions/tree_shape.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
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
    # YOUR CODE HERE: exercise tree_shape.sibling_draw_kernel, region 1 (delete the todo line when you start)
    todo("tree_shape.sibling_draw_kernel", region=1, lines=8)


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
