"""Two of a decoding step's elementwise operations as one Triton kernel each (GPU only).

`TinyLM.step` states them in torch: RoPE as a multiply and a multiply-add on q and k in place, and
the MLP's SwiGLU as silu(gate) * up. For one query per sample (a chain's draft step) torch runs
them as vectorised kernels; for several queries per sample (a tree's) the q/k slices and the
gate/up halves are strided views, and torch falls back to its generic strided kernel, measured at
3.6 us for the chain's step and 11.6 us for a 4-query step of the 1-layer draft on an H100
(`results/h100/step_profile.json` and notebook 21). Each kernel here reads its rows once, whatever
their strides, and replaces two launches (three for RoPE, whose cos/sin gather it folds in). Both
round as the torch statement does (products in float32, stored in the model's dtype at the same
points), so the fused and the torch step give the same numbers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def rope_kernel(heads, table, positions, HEADS: tl.constexpr, ROPE_HEADS: tl.constexpr, PARTNER: tl.constexpr,
                HD: tl.constexpr, BLOCK: tl.constexpr):
    """One program per token row of the workspace (its HEADS heads of HD numbers): the first
    ROPE_HEADS heads (q and k) become x cos + partner sin, the partner of head h being head
    PARTNER + h (`DecodeWeights`); cos and sin are row `positions[row]` of `table` (P, 2, HD)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    live = offs < ROPE_HEADS * HD
    col = offs % HD
    position = tl.load(positions + row)
    cos = tl.load(table + position * 2 * HD + col, mask=live, other=0.0).to(tl.float32)
    sin = tl.load(table + position * 2 * HD + HD + col, mask=live, other=0.0).to(tl.float32)
    base = heads + row * HEADS * HD
    x = tl.load(base + offs, mask=live, other=0.0)
    partner = tl.load(base + PARTNER * HD + offs, mask=live, other=0.0).to(tl.float32)
    scaled = (x.to(tl.float32) * cos).to(x.dtype)  # torch's mul_ rounds here
    tl.store(base + offs, (scaled.to(tl.float32) + partner * sin).to(x.dtype), mask=live)


@triton.jit
def silu_mul_kernel(gate_up, out, HIDDEN: tl.constexpr, BLOCK: tl.constexpr):
    """One program per row: out = silu(gate) * up, gate and up the two halves of the row."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    live = offs < HIDDEN
    gate = tl.load(gate_up + row * 2 * HIDDEN + offs, mask=live, other=0.0)
    up = tl.load(gate_up + row * 2 * HIDDEN + HIDDEN + offs, mask=live, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # F.silu rounds here
    tl.store(out + row * HIDDEN + offs, (silu.to(tl.float32) * up).to(gate.dtype), mask=live)


def rope(buffer: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, heads: int, rope_heads: int,
         partner: int, head_dim: int) -> None:
    """RoPE in place on the (rows, heads * head_dim) contiguous workspace buffer."""
    rows = buffer.shape[0]
    rope_kernel[(rows,)](buffer, table, positions, HEADS=heads, ROPE_HEADS=rope_heads, PARTNER=partner,
                         HD=head_dim, BLOCK=triton.next_power_of_2(rope_heads * head_dim))


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a contiguous (rows, 2 * hidden) tensor, (rows, hidden)."""
    rows, both = gate_up.shape
    hidden = both // 2
    out = torch.empty((rows, hidden), dtype=gate_up.dtype, device=gate_up.device)
    silu_mul_kernel[(rows,)](gate_up, out, HIDDEN=hidden, BLOCK=triton.next_power_of_2(hidden))
    return out
