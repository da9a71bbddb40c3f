"""Notebook 02's measurements: `python -m course bench attention` on a GPU writes
results/<device>/attention.json.

Section "flash": notebook 02's tiled attention in PyTorch (`flash_attention`, one key tile of
BLOCK_K per step, as the later kernels walk them) against one fused call of PyTorch's
scaled_dot_product_attention (`sdpa`), float32, causal mask, at each (B, H, N, d) of SHAPES. It shows
what the algorithm costs when each tile is a separate torch operation: the kernels of notebooks 03
onwards run the same bookkeeping inside one launch. max_abs_err: against the float64 reference
(`course.oracle.attention_with_lse`) on batch entry 0, head 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course import oracle
from course.core import inputs, runtime
from course.core.impl import bench_impl, load
from course.measure import timing

SUITE = "attention"
SHAPES = ((1, 10, 1024, 64), (10, 10, 1024, 64), (1, 10, 4096, 64))  # (B, H, N, d)
BLOCK_K = 64
SEED = 2024


def measure_shape(batch: int, heads: int, n: int, d: int) -> list[dict]:
    """The rows of one shape: the tiled algorithm and SDPA on the same random inputs."""
    attention = load("attention", bench_impl())
    device = runtime.torch_device()
    q, k, v = (inputs.random_tensor((batch, heads, n, d), SEED + i, torch.float32, device) for i in range(3))
    mask = torch.ones((n, n), dtype=torch.bool, device=device).tril()
    want, _ = oracle.attention_with_lse(q[0, 0].cpu(), k[0, 0].cpu(), v[0, 0].cpu(), mask.cpu())
    every_head = mask.expand(batch, heads, n, n)  # a view: the one mask for every (batch, head)
    methods = {"flash_attention": lambda: attention.flash_attention(q, k, v, every_head, block_k=BLOCK_K)[0],
               "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)}
    rows = []
    for name, run in methods.items():
        error = float((run()[0, 0].double().cpu() - want).abs().max())
        rows.append({"name": name, "B": batch, "H": heads, "N": n, "d": d, "block_k": BLOCK_K,
                     "median_ms": timing.bench(run), "max_abs_err": error})
    return rows


def flash_rows() -> list[dict]:
    return [row for shape in SHAPES for row in measure_shape(*shape)]


SECTIONS = {"flash": flash_rows}


def section_of(row: dict) -> str:
    """Every row of attention.json comes from the one section."""
    return "flash"
