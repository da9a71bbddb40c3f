"""Notebook 12's measurements: `python -m course bench triton_attention [sections]` on a GPU.

Writes results/<device>/triton_attention.json in the shared results schema. Rows:
  paper   at (B, H, N, d) = (10, 10, 1024, 64): triton_fp16 on the BFS and the DFS benchmark
          trees, triton_bf16, triton_fp32, sdpa_dense_fp16, flex_fp16 and k11 (the best Numba
          rung, float32; notebook 11c), all on the same trees and random inputs;
  sweep   triton_fp16, sdpa_dense_fp16 and flex_fp16 for N in 256 ... 4096 (B = H = 10, d = 64);
  configs triton_fp16 at the paper's shape with other tile configs than the fixed one.
Benchmark trees and inputs are `course.topics.ladder.bench`'s (FlashSpecInfer §6: a 32-token prompt
chain, then a random tree of fan-out 1-10), fp16 and bf16 inputs are its float32 inputs cast.
max_abs_err is `ladder_bench.max_abs_err`: batch entry 0, heads 0-1, rows 0-1023 against the
float64 oracle evaluated on the same (rounded) inputs. Triton rows: median_ms times both kernels
without the launcher's checks (the block lists, once per tree, and the attention), attention_ms
the attention kernel alone, launcher_ms the whole checked call. SDPA's dense mask and Flex's
block mask are built outside their timings. median_ms and attention_ms time CUDA graphs of the
calls (`course.measure.timing.bench_graphed`: the kernels run for tens of microseconds, about as long as a
launch from Python takes the host); launcher_ms, whose input checks wait for the GPU, is timed as
called. The whole run takes a few minutes at most
(FlexAttention compiles once per shape).
"""

from __future__ import annotations

import torch

from course.core import runtime
from course.core.impl import bench_impl, load
from course.measure import results, timing
from course.topics.ladder import bench as ladder_bench
from course.topics.triton_attention.launch import Config, config_for, prepare_attention, visible_blocks

SUITE = "triton_attention"
PAPER_SHAPE = ladder_bench.PAPER_SHAPE
TARGET_MS = 0.10  # the course's target for triton_fp16 at the paper's shape
SWEEP_N = (256, 512, 1024, 2048, 4096)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TRITON = {f"triton_{name}": dtype for name, dtype in DTYPES.items()}
BASELINES = {"sdpa_dense_fp16": ladder_bench.sdpa_dense, "flex_fp16": ladder_bench.flex}
NUMBA = ("k11",)  # the best Numba rung (notebook 11c), float32 only
NAMES = (*TRITON, *BASELINES, *NUMBA)
# Tile configs compared in the "configs" section: (block_m, block_n, num_warps, num_stages). All
# compile for sm_90 at d = 64 in fp16 without spilling registers.
CANDIDATE_CONFIGS = ((64, 64, 4, 3), (64, 64, 4, 2), (64, 64, 8, 3), (128, 64, 8, 3), (64, 32, 4, 3),
                     (32, 32, 4, 2), (128, 32, 4, 3))


def grading_kernels(exercise: str, impl: str):
    """What grading on a GPU times for notebook 12's kernel in `impl` ("lessons" or "solutions";
    `course.grading.speed`): `prepare_attention(...)`, the kernel without the launcher's input
    checks (as this bench times it), in fp16 at the ladder's PAPER_SHAPE, BFS trees."""
    if exercise != "triton_attention.tree_attention_kernel":
        raise ValueError(f"exercise must be triton_attention.tree_attention_kernel, got {exercise!r}")
    module = load("triton_attention", impl)
    batch, heads, n, d = PAPER_SHAPE
    q, k, v = (t.to(torch.float16) for t in ladder_bench.random_qkv(batch, heads, n, d))
    start, end = ladder_bench.benchmark_times(batch, n, "bfs")
    fn = prepare_attention(module, q, k, v, start, end)
    fn()  # compiles
    return fn


def dtype_of(name: str) -> torch.dtype:
    if name in TRITON:
        return TRITON[name]
    return torch.float16 if name in BASELINES else torch.float32


def measure(name: str, figure: str, batch: int, heads: int, n: int, d: int, order: str, *,
            rep_ms: float = 100, config=None) -> dict:
    """One row: `name` timed on the benchmark trees of (batch, n) in `order` and random inputs."""
    if name not in NAMES:
        raise ValueError(f"name must be one of {NAMES}, got {name!r}")
    dtype = dtype_of(name)
    q, k, v = (t.to(dtype) for t in ladder_bench.random_qkv(batch, heads, n, d))
    start, end = ladder_bench.benchmark_times(batch, n, order)
    row = {"name": name, "figure": figure, "B": batch, "H": heads, "N": n, "d": d, "order": order,
           "dtype": str(dtype).replace("torch.", "")}
    if name in NUMBA:
        measured = ladder_bench.measure(name, None, figure, batch, heads, n, d, order, rep_ms=rep_ms)
        return dict(measured, **row)
    if name in TRITON:
        module = load("triton_attention", bench_impl())
        fn = prepare_attention(module, q, k, v, start, end, config=config)
        out = fn()
        torch.cuda.synchronize()
        chosen = config or config_for(d, dtype)
        counts, _ = visible_blocks(start, end, chosen.block_m, chosen.block_n)
        key_blocks = -(-n // chosen.block_n)
        row.update(median_ms=timing.bench_graphed(fn, rep_ms=rep_ms),
                   attention_ms=timing.bench_graphed(fn.attention, rep_ms=rep_ms),
                   launcher_ms=timing.bench(lambda: module.tree_attention(q, k, v, start, end),
                                            rep_ms=rep_ms),
                   block_m=chosen.block_m, block_n=chosen.block_n, num_warps=chosen.num_warps,
                   num_stages=chosen.num_stages,
                   visited_fraction=float(counts.sum()) / (counts.numel() * key_blocks))
    else:
        fn = BASELINES[name](q, k, v, start, end)
        out = fn()
        torch.cuda.synchronize()
        row["median_ms"] = timing.bench_graphed(fn, rep_ms=rep_ms)
    row["max_abs_err"] = ladder_bench.max_abs_err(out, q, k, v, start, end)
    print(f"{figure:8} {name:16} B={batch:<3} H={heads:<3} N={n:<5} {order}: {row['median_ms']:.4f} ms, "
          f"err {row['max_abs_err']:.1e}", flush=True)
    return row


def paper_rows() -> list[dict]:
    batch, heads, n, d = PAPER_SHAPE
    rows = [measure("triton_fp16", "paper", batch, heads, n, d, order) for order in ("bfs", "dfs")]
    for name in ("triton_bf16", "triton_fp32", "sdpa_dense_fp16", "flex_fp16", "k11"):
        rows.append(measure(name, "paper", batch, heads, n, d, "bfs"))
    return rows


def sweep_rows() -> list[dict]:
    batch, heads, _, d = PAPER_SHAPE
    return [measure(name, "sweep", batch, heads, n, d, "bfs", rep_ms=50)
            for n in SWEEP_N for name in ("triton_fp16", "sdpa_dense_fp16", "flex_fp16")]


def config_rows() -> list[dict]:
    batch, heads, n, d = PAPER_SHAPE
    return [measure("triton_fp16", "configs", batch, heads, n, d, "bfs", rep_ms=50,
                    config=Config(*values))
            for values in CANDIDATE_CONFIGS]


SECTIONS = {"paper": paper_rows, "sweep": sweep_rows, "configs": config_rows}


def section_of(row: dict) -> str:
    """The section that measures a row of triton_attention.json (each row's "figure")."""
    return row["figure"]


def runtimes(names, order: str = "bfs") -> tuple[list[dict], str]:
    """Rows for `names` at the paper's shape, and where they come from.

    On a GPU they are measured now, in this one run; in the simulator they are the committed
    measurements (results/<device>/triton_attention.json), and NotMeasuredYet says when there are none.
    """
    names = list(names)
    unknown = [name for name in names if name not in NAMES]
    if unknown or not names:
        raise ValueError(f"names must be some of {list(NAMES)}; got {names}")
    if order not in ladder_bench.ORDERS:
        raise ValueError(f"order must be one of {ladder_bench.ORDERS}, got {order!r}")
    if runtime.on_gpu():
        batch, heads, n, d = PAPER_SHAPE
        rows = [measure(name, "paper", batch, heads, n, d, order) for name in names]
        return rows, f"measured now on {runtime.device_name()}"
    return results.committed_rows(SUITE, "paper", names, order)


def committed_rows(figure: str) -> tuple[list[dict], str]:
    """The committed rows of one figure ("paper", "sweep" or "configs") and where they come from
    (read from the file on a GPU too: the sweep takes minutes to measure)."""
    if figure not in SECTIONS:
        raise ValueError(f"figure must be one of {list(SECTIONS)}, got {figure!r}")
    document = results.load_measured(SUITE)
    rows = [row for row in document["rows"] if row.get("figure") == figure]
    if not rows:
        raise results.NotMeasuredYet(f"the committed triton_attention.json has no {figure!r} rows")
    return rows, (f"committed measurements from {document['device']} ({document['date'][:10]})")
