"""The KV cache's measurements (notebooks 17 and 18): `python -m course bench kvcache [sections]` on a
GPU writes results/<device>/kvcache.json.

EMS-SD (notebook 17), section "emssd" (rows with "study": "emssd").
For each batch size B in BATCHES, a batch is simulated the way EMS-SD §3 / Appendix B describes:
every sample starts from a prompt of PROMPT_MIN..PROMPT_MAX tokens and decodes STEPS speculative
steps; at each step sample b proposes k_b drafts (k_b uniform in 1..MAX_DRAFT: counts = k_b + 1
new tokens) and accepts a_b of its counts, a truncated geometric law with per-token acceptance
rate ALPHA (Leviathan et al. §3.5: P(a >= i + 1) = alpha^i), the realistic shape of accept
lengths. The unpadded cache grows by each sample's own a_b; the vanilla cache by max_b a_b
(`pyspec_ref.kvcache.vanilla_kv_growth`). Then one verification step is timed, at Llama-2-7B's
attention shape (32 heads, d = 128, fp16), by two methods:

  unpadded   `course.topics.kvcache.launch.prepare_unpadded_attention`: the Triton kernel, no input
             checks in the timing
  padded     the vanilla step: one masked SDPA over the padded rectangle (inputs padded to
             W = max counts, cache to the common padded length); padding built outside the timing

Row fields: name, study, B, H, N (the padded cache width), d, dtype, median_ms
(`course.measure.timing.bench`), max_abs_err (vs float64
`course.oracle.kvcache.unpadded_attention` on
ERROR_SAMPLES samples), real_tokens, padded_tokens (input slots), real_kv_slots, padded_kv_slots,
kv_bytes (the bytes its cache occupies), peak_bytes (torch peak allocation during one call,
outputs included).

SwiftSpec (notebook 18), sections "compaction" and "attention" (rows with "study": "swiftspec"
and "section": "swiftspec", "figure" the section's name):

* "compaction": SwiftSpec §3.2's compaction after one verification, `swiftspec.compact`
  (in place: each moved row read once and written once) against `baselines.naive_compact` (gather every
  moved row into a temporary, then copy it back: twice the traffic and an allocation). The cache
  is a whole model's, (B, layers x {k, v} x KV heads, C, d) in float16, for two shapes:
  MODELS (a Llama-3.2-1B-like draft model and a Llama-3-8B-like target). Per sample: a random
  speculative tree of N nodes (fan-out 1..4) after a prefix of PREFIX tokens, and a verified path
  with per-token acceptance ALPHA (`course.topics.kvcache.check.random_root_path`, stopping with
  probability 1 - ALPHA at each step), whose `compact_plan` gives
  the moves. Tree sizes TREES, cache capacities CACHES.
* "attention": SwiftSpec §3.1's non-square attention of w query nodes against [prefix | tree],
  `swiftspec.tree_cache_attention` ("nonsquare") against SDPA with a dense boolean
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

import functools
import random

import torch

from course.core import impl, runtime
from course.measure import timing
from course.oracle import kvcache as kv_oracle
from course.topics.kvcache import baselines, launch

SUITE = "kvcache"
ALPHA = 0.75  # per-token acceptance rate of the simulated drafts (both studies)
SEED = 2025

# --------------------------------------------------------------------------- EMS-SD (notebook 17)

EMSSD = "emssd"
BATCHES = (1, 2, 4, 8, 16, 32, 64)
HEADS, D, DTYPE = 32, 128, torch.float16
PROMPT_MIN, PROMPT_MAX = 256, 1024
STEPS = 64
MAX_DRAFT = 7
ERROR_SAMPLES = 4


def accept_length(count: int, rng: random.Random, alpha: float = ALPHA) -> int:
    """Accepted tokens of a step with `count` inputs: 1 + (drafts accepted before the first reject)."""
    accepted = 1
    while accepted < count and rng.random() < alpha:
        accepted += 1
    return accepted


def simulate(batch: int, seed: int = SEED) -> dict:
    """One batch after STEPS steps: counts of the timed step, real and vanilla cache lengths."""
    rng = random.Random(seed * 1000 + batch)
    prompts = [rng.randint(PROMPT_MIN, PROMPT_MAX) for _ in range(batch)]
    real, padded = list(prompts), max(prompts)
    for _ in range(STEPS):
        counts = [1 + rng.randint(1, MAX_DRAFT) for _ in range(batch)]
        accepted = [accept_length(c, rng) for c in counts]
        real = [n + a for n, a in zip(real, accepted, strict=True)]
        padded += max(accepted)
    counts = [1 + rng.randint(1, MAX_DRAFT) for _ in range(batch)]
    return {"counts": counts, "kv_lengths": real, "padded_length": padded}


def _peak(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - before)


def measure_unpadded(batch: int) -> list[dict]:
    """EMS-SD's unpadded against the vanilla padded verification step, at batch size `batch`."""
    from course.core.inputs import random_tensor

    sim = simulate(batch)
    counts, lengths, padded_len = sim["counts"], sim["kv_lengths"], sim["padded_length"]
    starts, row = [], 0
    for n, c in zip(lengths, counts, strict=True):
        starts.append(row)
        row += n + c
    device = runtime.torch_device()
    q = random_tensor((sum(counts), HEADS, D), 1, DTYPE, device)
    k = random_tensor((row, HEADS, D), 2, DTYPE, device)
    v = random_tensor((row, HEADS, D), 3, DTYPE, device)
    # Errors on the first few samples (the oracle is float64 on the CPU).
    few = min(ERROR_SAMPLES, batch)
    t_few, s_few = sum(counts[:few]), starts[few - 1] + lengths[few - 1] + counts[few - 1]
    want, _ = kv_oracle.unpadded_attention(q[:t_few].cpu(), k[:s_few].cpu(), v[:s_few].cpu(), counts[:few],
                                           starts[:few], lengths[:few])
    width = max(counts)
    base = dict(study=EMSSD, B=batch, H=HEADS, d=D, dtype="float16", real_tokens=sum(counts),
                padded_tokens=batch * width, real_kv_slots=sum(lengths) + sum(counts),
                padded_kv_slots=batch * (padded_len + width), accept_alpha=ALPHA, max_draft=MAX_DRAFT)
    rows = []

    run = launch.prepare_unpadded_attention(q, k, v, counts, starts, lengths, impl=impl.bench_impl())
    err = float((run()[:t_few].double().cpu() - want).abs().max())
    rows.append(dict(base, name="unpadded", N=max(n + c for n, c in zip(lengths, counts, strict=True)),
                     median_ms=timing.bench(run), max_abs_err=err, kv_bytes=2 * k.numel() * k.element_size(),
                     peak_bytes=_peak(run)))
    del run
    try:
        # The vanilla cache: every sample padded to the common length padded_len (>= max real).
        layout = baselines.pad_batch(q, k, v, counts, starts, lengths)
        extra = padded_len - max(lengths)
        pad = torch.zeros((batch, HEADS, extra, D), dtype=DTYPE, device=device)
        cached = max(lengths)
        kp = torch.cat([layout.k[:, :, :cached], pad, layout.k[:, :, cached:]], dim=2)
        vp = torch.cat([layout.v[:, :, :cached], pad, layout.v[:, :, cached:]], dim=2)
        mask = torch.cat([layout.mask[..., :cached],
                          torch.zeros((batch, 1, width, extra), dtype=torch.bool, device=device),
                          layout.mask[..., cached:]], dim=3)
        vanilla = baselines.PaddedBatch(layout.q, kp, vp, mask, layout.counts)
        del layout, pad

        def padded():
            return baselines.padded_forward(vanilla)
        out = baselines.unpad(padded(), counts)
        err = float((out[:t_few].double().cpu() - want).abs().max())
        rows.append(dict(base, name="padded", N=padded_len + width, median_ms=timing.bench(padded),
                         max_abs_err=err, kv_bytes=2 * kp.numel() * kp.element_size(),
                         peak_bytes=_peak(padded)))
    except torch.cuda.OutOfMemoryError as error:
        rows.append(dict(base, name="padded", N=padded_len + width, median_ms=None, max_abs_err=None,
                         error=f"out of memory: {error}"[:200]))
    torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------- SwiftSpec (notebook 18)

SWIFTSPEC = "swiftspec"
MODELS = {"llama-3.2-1b draft": (16, 8, 64), "llama-3-8b": (32, 8, 128)}  # layers, KV heads, d
BATCH = 4
PREFIX = 1024
TREES = (16, 64, 256)
CACHES = (2048, 8192)
ATTN_HEADS, ATTN_KV_HEADS, ATTN_D = 32, 8, 128
ATTN_WORKLOADS = ((1024, 64, 8), (1024, 256, 32), (4096, 64, 8), (4096, 256, 32), (4096, 256, 256))  # P, N, w


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
    from course.topics.kvcache.check import slot_sources

    layers, heads_kv, d = MODELS[model]
    rows_r = layers * 2 * heads_kv
    device = runtime.torch_device()
    samples, plans = plans_for(BATCH, n, PREFIX, SEED + n)
    cache = torch.randn((BATCH, rows_r, capacity, d), dtype=torch.float16, device=device)
    src, dst, counts = launch.plan_tensors(plans, device)
    moves = int(counts.sum())
    sources = [slot_sources(p, t, path, capacity) for p, t, path in samples]
    width = PREFIX + n
    want = kv_oracle.compaction(cache[:, :, :width].clone(), [s[:width] for s in sources])
    element = cache.element_size()
    base = dict(study=SWIFTSPEC, section=SWIFTSPEC, figure="compaction", model=model,
                workload=f"{model}, N={n}, C={capacity}", B=BATCH, H=rows_r, N=n, P=PREFIX, C=capacity,
                d=d, moves=moves, dtype="float16",
                cache_bytes=cache.numel() * element)
    out = []
    compact = functools.partial(launch.prepare_compact, impl=impl.bench_impl())
    methods = (("compact", compact, 2), ("naive", baselines.prepare_naive_compact, 4))
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

    triton_attention = impl.load("triton_attention", impl.bench_impl())


    kwargs, mask, trees = _attention_inputs(prefix, n, w, SEED + prefix + n + w)
    used = prefix + n
    first = {k: v[:1] for k, v in kwargs.items()}
    want, _ = kv_oracle.nonsquare_tree_attention(**first)
    workload = f"P={prefix}, N={n}, w={w}"
    element = 2
    base = dict(study=SWIFTSPEC, section=SWIFTSPEC, figure="attention", workload=workload,
                model="llama-3-8b attention", B=BATCH, H=ATTN_HEADS, N=n, P=prefix,
                C=kwargs["k_cache"].shape[2], d=ATTN_D, w=w, dtype="float16")
    kv_bytes = 2 * BATCH * ATTN_KV_HEADS * used * ATTN_D * element
    out = []
    run = launch.prepare_tree_attention(**kwargs, impl=impl.bench_impl())
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
    from course.topics.triton_attention.launch import prepare_attention

    start, end = dfs_times_tensors(trees, q.device)
    tq = torch.randn((BATCH, ATTN_HEADS, n, ATTN_D), device=q.device, dtype=q.dtype)
    group = ATTN_HEADS // ATTN_KV_HEADS
    tk = kwargs["k_cache"][:, :, prefix:used].repeat_interleave(group, dim=1).contiguous()
    tv = kwargs["v_cache"][:, :, prefix:used].repeat_interleave(group, dim=1).contiguous()
    square = prepare_attention(triton_attention, tq, tk, tv, start, end)
    got = square()
    ref, _ = oracle.tree_attention(tq[:1].cpu(), tk[:1].cpu(), tv[:1].cpu(), start[:1].cpu(), end[:1].cpu())
    out.append(dict(base, name="square_tree", median_ms=timing.bench_graphed(square),
                    max_abs_err=float((got[:1].double().cpu() - ref).abs().max()),
                    bytes=3 * BATCH * ATTN_HEADS * n * ATTN_D * element, cells=BATCH * ATTN_HEADS * n * n,
                    note="N x N over the tree only (no prefix): a lower bound for re-running the tree"))
    del kwargs, tq, tk, tv
    torch.cuda.empty_cache()
    return out


# --------------------------------------------------------------------------- the sections


def emssd_rows() -> list[dict]:
    return [row for batch in BATCHES for row in measure_unpadded(batch)]


def compaction_rows() -> list[dict]:
    return [row for model in MODELS for capacity in CACHES for n in TREES
            for row in measure_compaction(model, n, capacity)]


def attention_rows() -> list[dict]:
    return [row for prefix, n, w in ATTN_WORKLOADS for row in measure_attention(prefix, n, w)]


SECTIONS = {"emssd": emssd_rows, "compaction": compaction_rows, "attention": attention_rows}


def section_of(row: dict) -> str:
    """The section that measures a row of kvcache.json."""
    return EMSSD if row.get("study") == EMSSD else row["figure"]
