"""SwiftSpec's measurements (notebook 18): `python -m course.topics.kvcache.bench` on a GPU adds rows with
"study": "swiftspec" (and "section": "swiftspec") to results/<device>/kvcache.json, keeping the rows
of the other studies of that suite (EMS-SD, notebook 17), and draws results/<device>/swiftspec_*.png.

Two figures:

* "compaction": SwiftSpec §3.2's compaction after one verification, `solutions.swiftspec.compact`
  (in place: each moved row read once and written once) against `naive_compact` (gather every
  moved row into a temporary, then copy it back: twice the traffic and an allocation). The cache
  is a whole model's, (B, layers x {k, v} x KV heads, C, d) in float16, for two shapes:
  MODELS (a Llama-3.2-1B-like draft model and a Llama-3-8B-like target). Per sample: a random
  speculative tree of N nodes (fan-out 1..4) after a prefix of PREFIX tokens, and a verified path
  with per-token acceptance ALPHA (`course.topics.kvcache.check.random_root_path`, stopping with
  probability 1 - ALPHA at each step), whose `compact_plan` gives
  the moves. Tree sizes TREES, cache capacities CACHES.
* "attention": SwiftSpec §3.1's non-square attention of w query nodes against [prefix | tree],
  `solutions.swiftspec.tree_cache_attention` ("nonsquare") against SDPA with a dense boolean
  (w, P + N) mask built outside the timing ("sdpa_dense_mask", GQA via enable_gqa), and against
  the square notebook-12 kernel over the whole tree ("square_tree", N x N queries and keys, the
  prefix not even included: what re-running the whole tree each round would cost at least).
  Llama-3-8B's attention shape (32 query heads, 8 KV heads, d = 128, fp16).

Row fields: name, study, section, figure, workload, model, B, H (query heads; stacked rows R for
compaction), N (tree nodes), P, C, d, w, moves, bytes (what the method reads and writes),
median_ms (`course.measure.timing.bench`; the attention methods as CUDA graphs,
`course.measure.timing.bench_graphed`),
max_abs_err (compaction: vs `pyspec_ref.kvcache.apply_moves` applied by index on the slots;
attention: vs the float64 oracle of `course.topics.kvcache.check` on the first sample).
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from course.core import impl, runtime
from course.measure import results, timing

SUITE = "kvcache"
STUDY = "swiftspec"
MODELS = {"llama-3.2-1b draft": (16, 8, 64), "llama-3-8b": (32, 8, 128)}  # layers, KV heads, d
BATCH = 4
PREFIX = 1024
TREES = (16, 64, 256)
CACHES = (2048, 8192)
ALPHA = 0.75
ATTN_HEADS, ATTN_KV_HEADS, ATTN_D = 32, 8, 128
ATTN_WORKLOADS = ((1024, 64, 8), (1024, 256, 32), (4096, 64, 8), (4096, 256, 32), (4096, 256, 256))  # P, N, w
SEED = 2025


def random_verification(n: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """(parents, verified path): a random speculative tree of n nodes and the path the target accepts,
    each next draft accepted with probability ALPHA (among the current node's children, uniformly)."""
    from course.core.inputs import random_tree
    from course.topics.kvcache.check import random_root_path

    parents = random_tree(n, rng, max_children=4)
    return parents, random_root_path(parents, rng, stop=1 - ALPHA)


def plans_for(batch: int, n: int, prefix: int, seed: int) -> tuple[list, list]:
    """Per sample (prefix, parents, path) and its compact_plan."""
    import pyspec_ref.kvcache as spec

    rng = random.Random(seed)
    samples = []
    for _ in range(batch):
        parents, path = random_verification(n, rng)
        samples.append((prefix, parents, path))
    return samples, [spec.compact_plan(p, t, path) for p, t, path in samples]


def measure_compaction(model: str, n: int, capacity: int) -> list[dict]:
    swiftspec = impl.load("swiftspec", impl.bench_impl())

    from course.topics.kvcache.check import reference_compaction, slot_sources

    layers, heads_kv, d = MODELS[model]
    rows_r = layers * 2 * heads_kv
    device = runtime.torch_device()
    samples, plans = plans_for(BATCH, n, PREFIX, SEED + n)
    cache = torch.randn((BATCH, rows_r, capacity, d), dtype=torch.float16, device=device)
    src, dst, counts = swiftspec.plan_tensors(plans, device)
    moves = int(counts.sum())
    sources = [slot_sources(p, t, path, capacity) for p, t, path in samples]
    width = PREFIX + n
    want = reference_compaction(cache[:, :, :width].clone(), [s[:width] for s in sources])
    element = cache.element_size()
    base = dict(study=STUDY, section=STUDY, figure="compaction", model=model,
                workload=f"{model}, N={n}, C={capacity}", B=BATCH, H=rows_r, N=n, P=PREFIX, C=capacity,
                d=d, moves=moves, dtype="float16",
                cache_bytes=cache.numel() * element)
    out = []
    methods = (("compact", swiftspec.compact_runner, 2), ("naive", swiftspec.naive_runner, 4))
    for name, make, traffic in methods:
        trial = cache.clone()
        run = make(trial, src, dst, counts)
        run()
        err = float((trial[:, :, :width].float() - want.float()).abs().max())
        del trial
        run = make(cache, src, dst, counts)  # timing: re-applies the moves to the same rows
        out.append(dict(base, name=name, median_ms=timing.bench(run), max_abs_err=err,
                        bytes=traffic * moves * rows_r * d * element))
        del run
    del cache, want
    torch.cuda.empty_cache()
    return out


def _attention_inputs(prefix: int, n: int, w: int, seed: int):
    """(kwargs of tree_cache_attention, the dense (B, 1, w, P + N) mask, per-sample parents).

    The inputs of notebook 18's check (`course.topics.kvcache.check.attention_problem`) at the
    benchmark's size: BATCH random trees of n nodes after a prefix of `prefix` rows, the newest
    w nodes as the queries (the ones being expanded or verified)."""
    from course.core.inputs import random_tree
    from course.topics.kvcache.check import attention_problem

    rng = random.Random(seed)
    trees = [random_tree(n, rng, max_children=4) for _ in range(BATCH)]
    samples = [(prefix, parents, list(range(n - w, n)), None) for parents in trees]
    kwargs, _ = attention_problem(samples, ATTN_HEADS, ATTN_KV_HEADS, w, ATTN_D, torch.float16, seed,
                                  capacity=prefix + n + 64)
    device = kwargs["q"].device
    used = prefix + n
    rows = torch.arange(used, device=device)
    tree = rows >= prefix
    ancestor = (kwargs["kv_start"][:, None, :used] <= kwargs["q_start"][:, :, None]) & (
        kwargs["q_end"][:, :, None] <= kwargs["kv_end"][:, None, :used])
    mask = (~tree)[None, None, :] | (tree[None, None, :] & ancestor)
    return kwargs, mask[:, None], trees


def measure_attention(prefix: int, n: int, w: int) -> list[dict]:
    import torch.nn.functional as F

    swiftspec = impl.load("swiftspec", impl.bench_impl())
    triton_attention = impl.load("triton_attention", impl.bench_impl())

    from course.topics.kvcache.check import oracle_tree_cache

    kwargs, mask, trees = _attention_inputs(prefix, n, w, SEED + prefix + n + w)
    used = prefix + n
    first = {k: v[:1] for k, v in kwargs.items()}
    want, _ = oracle_tree_cache(**first)
    workload = f"P={prefix}, N={n}, w={w}"
    element = 2
    base = dict(study=STUDY, section=STUDY, figure="attention", workload=workload,
                model="llama-3-8b attention", B=BATCH, H=ATTN_HEADS, N=n, P=prefix,
                C=kwargs["k_cache"].shape[2], d=ATTN_D, w=w, dtype="float16")
    kv_bytes = 2 * BATCH * ATTN_KV_HEADS * used * ATTN_D * element
    out = []
    run = swiftspec.attention_runner(**kwargs)
    err = float((run()[:1].double().cpu() - want).abs().max())
    out.append(dict(base, name="nonsquare", median_ms=timing.bench_graphed(run), max_abs_err=err,
                    bytes=kv_bytes, cells=BATCH * ATTN_HEADS * w * used))
    q, k, v = kwargs["q"], kwargs["k_cache"][:, :, :used], kwargs["v_cache"][:, :, :used]
    def dense():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    try:
        err = float((dense()[:1].double().cpu() - want).abs().max())
        out.append(dict(base, name="sdpa_dense_mask", median_ms=timing.bench_graphed(dense), max_abs_err=err,
                        bytes=kv_bytes + mask.numel(), cells=BATCH * ATTN_HEADS * w * used))
    except (RuntimeError, TypeError) as error:  # an SDPA without enable_gqa, or out of memory
        out.append(dict(base, name="sdpa_dense_mask", median_ms=None, max_abs_err=None,
                        error=str(error)[:200]))
    # The square alternative: all N tree nodes as queries against the N tree rows (no prefix).
    from course import oracle
    from course.core.inputs import dfs_times_tensors

    start, end = dfs_times_tensors(trees, q.device)
    tq = torch.randn((BATCH, ATTN_HEADS, n, ATTN_D), device=q.device, dtype=q.dtype)
    group = ATTN_HEADS // ATTN_KV_HEADS
    tk = kwargs["k_cache"][:, :, prefix:used].repeat_interleave(group, dim=1).contiguous()
    tv = kwargs["v_cache"][:, :, prefix:used].repeat_interleave(group, dim=1).contiguous()
    square = triton_attention.prepare(tq, tk, tv, start, end)
    got = square()
    ref, _ = oracle.tree_attention(tq[:1].cpu(), tk[:1].cpu(), tv[:1].cpu(), start[:1].cpu(), end[:1].cpu())
    out.append(dict(base, name="square_tree", median_ms=timing.bench_graphed(square),
                    max_abs_err=float((got[:1].double().cpu() - ref).abs().max()),
                    bytes=3 * BATCH * ATTN_HEADS * n * ATTN_D * element, cells=BATCH * ATTN_HEADS * n * n,
                    note="N x N over the tree only (no prefix): a lower bound for re-running the tree"))
    del kwargs, tq, tk, tv
    torch.cuda.empty_cache()
    return out


def save_rows(rows: list[dict], figures=("compaction", "attention")):
    """Merge into results/<device>/kvcache.json: keep every other study's rows (EMS-SD's) and this
    study's rows of figures not measured now; replace this study's rows of `figures`."""
    def ours(row):
        return STUDY in (row.get("study"), row.get("section")) and row.get("figure") in figures
    return results.save(SUITE, results.kept_rows(SUITE, lambda row: not ours(row)) + rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("compaction", "attention"), default=None)
    parser.add_argument("--no-figures", action="store_true")
    args = parser.parse_args(argv)
    if runtime.SIMULATOR:
        raise SystemExit("course.topics.kvcache.bench measures a GPU; the simulator has no times to record")
    rows = []
    if args.only in (None, "compaction"):
        for model in MODELS:
            for capacity in CACHES:
                for n in TREES:
                    for row in measure_compaction(model, n, capacity):
                        print(json.dumps({k: row.get(k) for k in ("name", "workload", "moves", "median_ms",
                                                                  "max_abs_err")}), flush=True)
                        rows.append(row)
    if args.only in (None, "attention"):
        for prefix, n, w in ATTN_WORKLOADS:
            for row in measure_attention(prefix, n, w):
                print(json.dumps({k: row.get(k) for k in ("name", "workload", "median_ms", "max_abs_err")}),
                      flush=True)
                rows.append(row)
    path = save_rows(rows, ("compaction", "attention") if args.only is None else (args.only,))
    print("wrote", path)
    if not args.no_figures:
        from course.topics.kvcache import figures as kv_plots

        measured = results.load(SUITE, path.parent.name)
        label = f"{measured['device']}, {measured['date'][:10]}"
        figures = (("compaction", kv_plots.compaction_figure), ("attention", kv_plots.attention_figure))
        for figure, draw in figures:
            try:
                fig = draw(measured["rows"], note=label)
            except ValueError:
                continue
            fig.savefig(path.parent / f"swiftspec_{figure}.png", dpi=120, bbox_inches="tight")
            print("wrote", path.parent / f"swiftspec_{figure}.png")


if __name__ == "__main__":
    main()
