"""The ladder's measurements (notebook 11): `python -m course bench ladder [sections]` on a GPU.

Writes results/<device>/ladder.json in the shared results schema. Every row times
one kernel on one benchmark tree with `course.measure.timing.bench` (warm-up, then the
median of many runs) on random inputs; the baselines run in the same process on
the same inputs:
  sdpa_dense_fp32  torch.nn.functional.scaled_dot_product_attention, fp32, the dense bool mask
  flex_fp32        FlexAttention (torch.compile'd), fp32, a block mask from the same DFS times
Benchmark trees follow FlashSpecInfer §6: a prompt chain, then a random tree with
fan-out 1-10, N nodes in all, numbered breadth first (as a tree is drafted) or in
DFS order. max_abs_err compares batch entry 0, heads 0-1, rows 0-1023 with the float64
oracle. Numba rungs have median_ms for their kernels alone (every kernel the launcher
launches, relaunched with the same arguments: `course.core.launch.kernels_of`; rung 1 then
starts from its previous state, which does the same work) and launcher_ms for the whole call.
"""

from __future__ import annotations

import random

import torch

from course import oracle
from course.core import inputs, runtime
from course.core.impl import bench_impl, load
from course.core.launch import kernels_of
from course.measure import results, timing
from course.topics.ladder import rungs as ladder

PAPER_SHAPE = (10, 10, 1024, 64)  # (B, H, N, d) of FlashSpecInfer's Figure 3
PROMPT = 32
SEED = 2024
ERROR_HEADS = 2
ERROR_ROWS = 1024


def benchmark_times(batch: int, n: int, order: str, seed: int = SEED):
    """(start, end) of `batch` benchmark trees of n nodes, on the GPU."""
    rng = random.Random(seed)
    trees = [inputs.speculative_tree(n, min(PROMPT, n), rng, order=order) for _ in range(batch)]
    return tuple(t.cuda() for t in inputs.dfs_times_tensors(trees))


def random_qkv(batch, heads, n, d, seed: int = SEED):
    return tuple(inputs.random_tensor((batch, heads, n, d), seed + j, torch.float32, "cuda")
                 for j in range(3))


def max_abs_err(out, q, k, v, start, end) -> float:
    """Largest error on batch entry 0, the first heads and rows, against the float64 oracle.

    Nodes are numbered parent-first, so rows below ERROR_ROWS see only keys below it, and
    the oracle on that corner is exact for them (and fits in memory at any N).
    """
    h, r = slice(0, ERROR_HEADS), slice(0, ERROR_ROWS)
    want, _ = oracle.tree_attention(q[:1, h, r], k[:1, h, r], v[:1, h, r], start[:1, r], end[:1, r])
    return float((out[:1, h, r].double() - want).abs().max())


def sdpa_dense(q, k, v, start, end):
    mask = oracle.dense_tree_mask(start, end).unsqueeze(1)  # built once, outside the timing
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


_flex = None


def flex(q, k, v, start, end):
    global _flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _flex is None:
        _flex = torch.compile(flex_attention, dynamic=False)

    def sees(b, h, q_idx, kv_idx):
        return (start[b, kv_idx] <= start[b, q_idx]) & (end[b, q_idx] <= end[b, kv_idx])

    batch, _, n, _ = q.shape
    block_mask = create_block_mask(sees, batch, None, n, n, device="cuda")
    return lambda: _flex(q, k, v, block_mask=block_mask)


def rung_fn(rung: ladder.Rung, q, k, v, start, end, impl: str | None = None):
    """A call of the rung's launcher; impl: "solutions" or "lessons" (default: `impl.bench_impl()`,
    the solutions, or the student's lessons in a hand-out)."""
    module = load(rung.module, impl or bench_impl())
    if rung.module == "ladder_dense":
        mask = oracle.dense_tree_mask(start, end)
        return lambda: module.tree_attention_dense(q, k, v, mask)
    return lambda: module.tree_attention(q, k, v, start, end)


def grading_kernels(exercise: str, impl: str):
    """What grading on a GPU times for a rung's exercise ("ladder_k4.tree_attention_kernel") in `impl`
    ("lessons" or "solutions"; `course.grading.speed`): the rung's kernels alone (`kernels_of`, as
    this bench times them) at FlashSpecInfer's shape PAPER_SHAPE, BFS trees."""
    module, _, function = exercise.partition(".")
    if module not in ladder.BY_MODULE or function != "tree_attention_kernel":
        raise ValueError(f"exercise must be a rung's tree_attention_kernel, got {exercise!r}")
    batch, heads, n, d = PAPER_SHAPE
    q, k, v = random_qkv(batch, heads, n, d)
    start, end = benchmark_times(batch, n, "bfs")
    return kernels_of(rung_fn(ladder.BY_MODULE[module], q, k, v, start, end, impl))


def kernel_resources(rung: ladder.Rung, d: int) -> dict:
    """Static shared memory per block and registers per thread of a rung's compiled kernel."""
    kernel = load(rung.module, bench_impl()).build(d)
    (shared,) = kernel.get_shared_mem_per_block().values()  # one compiled signature
    (registers,) = kernel.get_regs_per_thread().values()
    return {"shared_bytes": int(shared), "registers": int(registers), "threads": 32}


def measure(name, make, figure, batch, heads, n, d, order, *, rep_ms=200, extra=None) -> dict:
    q, k, v = random_qkv(batch, heads, n, d)
    start, end = benchmark_times(batch, n, order)
    if name in ladder.BY_NAME:
        fn = rung_fn(ladder.BY_NAME[name], q, k, v, start, end)
    else:
        fn = make(q, k, v, start, end)
    out = fn()
    torch.cuda.synchronize()
    row = {"name": name, "figure": figure, "B": batch, "H": heads, "N": n, "d": d, "order": order,
           "max_abs_err": max_abs_err(out, q, k, v, start, end)}
    if name in ladder.BY_NAME:
        # The kernel alone (median_ms), as for the baselines, and the whole launcher call,
        # whose input checks wait for the GPU (launcher_ms).
        row["median_ms"] = timing.bench(kernels_of(fn), rep_ms=rep_ms)
        row["launcher_ms"] = timing.bench(fn, rep_ms=rep_ms)
    else:
        row["median_ms"] = timing.bench(fn, rep_ms=rep_ms)
    row.update(extra or {})
    print(f"{figure:8} {name:16} B={batch:<3} H={heads:<3} N={n:<6} {order}: {row['median_ms']:.4f} ms, "
          f"err {row['max_abs_err']:.1e}", flush=True)
    return row


BASELINES = {"sdpa_dense_fp32": sdpa_dense, "flex_fp32": flex}
# The rungs beyond the paper that skip key tiles, measured in both numberings.
SKIPPING = tuple(rung.name for rung in ladder.RUNGS if rung.skips_tiles)
ORDERS = ("bfs", "dfs")


def ladder_rows() -> list[dict]:
    """Figure 3: every rung and both baselines at the paper's shape; rung 9 in both orders."""
    batch, heads, n, d = PAPER_SHAPE
    rows = []
    for rung in ladder.RUNGS:
        rows.append(measure(rung.name, None, "ladder", batch, heads, n, d, "bfs"))
        rows[-1].update(kernel_resources(rung, d))  # compiled by now
    for name in SKIPPING:  # the numbering decides what they skip
        rows.append(measure(name, None, "ladder", batch, heads, n, d, "dfs"))
    for name, make in BASELINES.items():
        rows.append(measure(name, make, "ladder", batch, heads, n, d, "bfs"))
    return rows


def sweep_rows() -> list[dict]:
    """Figures 5-7: dense vs interval mask across N; the kernels vs PyTorch across N and B."""
    rows = []
    heads, d = PAPER_SHAPE[1], PAPER_SHAPE[3]
    for n in (256, 512, 1024, 2048, 4096):
        for name in ("k8", "k8_dense"):
            rows.append(measure(name, None, "dense", 10, heads, n, d, "bfs"))
    shapes = [(10, n) for n in (128, 256, 512, 1024, 2048)] + [(b, 1024) for b in (1, 4, 16)]
    shapes += [(1, n) for n in (64, 128, 256)]
    for batch, n in shapes:
        for name, order in (("k8", "bfs"), *((name, order) for name in SKIPPING for order in ORDERS)):
            rows.append(measure(name, None, "pytorch", batch, heads, n, d, order))
        for name, make in BASELINES.items():
            rows.append(measure(name, make, "pytorch", batch, heads, n, d, "bfs"))
    return rows


def memory_rows(n: int = 1 << 18, batch: int = 2) -> list[dict]:
    """§6.1 extended: at this size the dense mask (B * N^2 bytes) cannot be allocated;
    the interval kernels still run (one timed run each: they take long)."""
    rows = []
    try:
        mask = torch.empty((batch, n, n), dtype=torch.bool, device="cuda")
        dense_allocated = True
        del mask
    except torch.OutOfMemoryError:
        dense_allocated = False
    torch.cuda.empty_cache()
    memory = {"dense_mask_bytes": batch * n * n, "dense_mask_allocated": dense_allocated,
              "gpu_bytes": torch.cuda.get_device_properties(0).total_memory}
    for name, order in [(name, "dfs") for name in SKIPPING] + [("k8", "bfs")]:
        rows.append(measure(name, None, "memory", batch, 1, n, 64, order, rep_ms=1, extra=memory))
    return rows


SECTIONS = {"ladder": ladder_rows, "sweeps": sweep_rows, "memory": memory_rows}


def runtimes(names, order: str = "bfs") -> tuple[list[dict], str]:
    """Rows for rungs and baselines at the paper's shape, and where they come from.

    On a GPU they are measured now, all in this one run; in the simulator they are the
    committed measurements (results/<device>/ladder.json), and the second value says so.
    """
    names = list(names)
    unknown = [name for name in names if name not in ladder.BY_NAME and name not in BASELINES]
    if unknown:
        raise ValueError(f"names must be rungs {list(ladder.BY_NAME)} or baselines {list(BASELINES)}; "
                         f"got {unknown}")
    if runtime.on_gpu():
        batch, heads, n, d = PAPER_SHAPE
        rows = [measure(name, BASELINES.get(name), "ladder", batch, heads, n, d, order, rep_ms=100)
                for name in names]
        return rows, f"measured now on {runtime.device_name()}"
    return results.committed_rows("ladder", "ladder", names, order)


def runtimes_if_measured(names, order: str = "bfs") -> list[dict]:
    """`runtimes(names, order)[0]`, or [] with a printed note where the committed file holds
    no such rows yet (a rung added since the last GPU run)."""
    try:
        return runtimes(names, order)[0]
    except results.NotMeasuredYet as missing:
        print(f"not measured yet: {missing}")
        return []


FIGURES_OF = {"ladder": ("ladder",), "sweeps": ("dense", "pytorch"), "memory": ("memory",)}
SUITE = "ladder"


def section_of(row: dict) -> str:
    """The section that measures a row of ladder.json."""
    return next(section for section, figures in FIGURES_OF.items() if row["figure"] in figures)


def measurements(sections=None) -> tuple[dict, str]:
    """A ladder.json document for `sections` (all by default), and where its numbers come from.

    On a GPU the sections are measured now (minutes: every rung, both baselines, the sweeps and
    the memory run), and the document is returned unsaved; `python -m course bench ladder` saves
    one. In the simulator it is the committed results/<device>/ladder.json, reduced to the rows
    of those sections, and the second value names the device and the date it was measured on.
    """
    sections = list(SECTIONS) if sections is None else [sections] if isinstance(sections, str) \
        else list(sections)
    unknown = [section for section in sections if section not in SECTIONS]
    if unknown or not sections:
        raise ValueError(f"sections must be some of {list(SECTIONS)}; got {sections}")
    if runtime.on_gpu():
        torch._dynamo.config.cache_size_limit = 64  # FlexAttention compiles once per shape
        rows = []
        for section in sections:
            rows += SECTIONS[section]()
        document = results.document("ladder", rows)
        return document, f"measured now on {document['device']} ({document['date'][:10]})"
    document = results.load("ladder")
    figures = {figure for section in sections for figure in FIGURES_OF[section]}
    document = dict(document, rows=[row for row in document["rows"] if row.get("figure") in figures])
    return document, (f"simulator: these are the committed measurements from {document['device']} "
                      f"({document['date'][:10]}), not timings of this machine")
