"""EMS-SD's measurements (notebook 17): `python -m course.topics.kvcache.emssd_bench` on a GPU writes
results/<device>/kvcache.json (rows with "study": "emssd"; other studies' rows are kept).

For each batch size B in BATCHES, a batch is simulated the way EMS-SD §3 / Appendix B describes:
every sample starts from a prompt of PROMPT_MIN..PROMPT_MAX tokens and decodes STEPS speculative
steps; at each step sample b proposes k_b drafts (k_b uniform in 1..MAX_DRAFT: counts = k_b + 1
new tokens) and accepts a_b of its counts, a truncated geometric law with per-token acceptance
rate ALPHA (Leviathan et al. §3.5: P(a >= i + 1) = alpha^i), the realistic shape of accept
lengths. The unpadded cache grows by each sample's own a_b; the vanilla cache by max_b a_b
(`pyspec_ref.kvcache.vanilla_kv_growth`). Then one verification step is timed, at Llama-2-7B's
attention shape (32 heads, d = 128, fp16), by two methods:

  unpadded   `solutions.emssd.make_runner`: the Triton kernel, no input checks in the timing
  padded     the vanilla step: one masked SDPA over the padded rectangle (inputs padded to
             W = max counts, cache to the common padded length); padding built outside the timing

Row fields: name, study, B, H, N (the padded cache width), d, dtype, median_ms
(`course.measure.timing.bench`), max_abs_err (vs float64
`course.topics.kvcache.emssd_check.oracle_unpadded` on
ERROR_SAMPLES samples), real_tokens, padded_tokens (input slots), real_kv_slots, padded_kv_slots,
kv_bytes (the bytes its cache occupies), peak_bytes (torch peak allocation during one call,
outputs included).
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from course.core import runtime
from course.measure import results, timing

SUITE = "kvcache"
STUDY = "emssd"
BATCHES = (1, 2, 4, 8, 16, 32, 64)
HEADS, D, DTYPE = 32, 128, torch.float16
PROMPT_MIN, PROMPT_MAX = 256, 1024
STEPS = 64
MAX_DRAFT = 7
ALPHA = 0.75
ERROR_SAMPLES = 4
SEED = 2025


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


def measure(batch: int) -> list[dict]:
    from course.core.impl import bench_impl, load
    from course.core.inputs import random_tensor
    from course.topics.kvcache.emssd_check import oracle_unpadded

    emssd = load("emssd", bench_impl())
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
    want, _ = oracle_unpadded(q[:t_few].cpu(), k[:s_few].cpu(), v[:s_few].cpu(), counts[:few], starts[:few],
                              lengths[:few])
    width = max(counts)
    base = dict(study=STUDY, B=batch, H=HEADS, d=D, dtype="float16", real_tokens=sum(counts),
                padded_tokens=batch * width, real_kv_slots=sum(lengths) + sum(counts),
                padded_kv_slots=batch * (padded_len + width), accept_alpha=ALPHA, max_draft=MAX_DRAFT)
    rows = []

    run = emssd.make_runner(q, k, v, counts, starts, lengths)
    err = float((run()[:t_few].double().cpu() - want).abs().max())
    rows.append(dict(base, name="unpadded", N=max(n + c for n, c in zip(lengths, counts, strict=True)),
                     median_ms=timing.bench(run), max_abs_err=err, kv_bytes=2 * k.numel() * k.element_size(),
                     peak_bytes=_peak(run)))
    del run
    try:
        # The vanilla cache: every sample padded to the common length padded_len (>= max real).
        layout = emssd.pad_batch(q, k, v, counts, starts, lengths)
        extra = padded_len - max(lengths)
        pad = torch.zeros((batch, HEADS, extra, D), dtype=DTYPE, device=device)
        cached = max(lengths)
        kp = torch.cat([layout.k[:, :, :cached], pad, layout.k[:, :, cached:]], dim=2)
        vp = torch.cat([layout.v[:, :, :cached], pad, layout.v[:, :, cached:]], dim=2)
        mask = torch.cat([layout.mask[..., :cached],
                          torch.zeros((batch, 1, width, extra), dtype=torch.bool, device=device),
                          layout.mask[..., cached:]], dim=3)
        vanilla = emssd.PaddedBatch(layout.q, kp, vp, mask, layout.counts)
        del layout, pad

        def padded():
            return emssd.padded_forward(vanilla)
        out = emssd.unpad(padded(), counts)
        err = float((out[:t_few].double().cpu() - want).abs().max())
        rows.append(dict(base, name="padded", N=padded_len + width, median_ms=timing.bench(padded),
                         max_abs_err=err, kv_bytes=2 * kp.numel() * kp.element_size(),
                         peak_bytes=_peak(padded)))
    except torch.cuda.OutOfMemoryError as error:
        rows.append(dict(base, name="padded", N=padded_len + width, median_ms=None, max_abs_err=None,
                         error=f"out of memory: {error}"[:200]))
    torch.cuda.empty_cache()
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="comma-separated B values")
    args = parser.parse_args(argv)
    if runtime.SIMULATOR:
        raise SystemExit("course.topics.kvcache.emssd_bench measures a GPU; the simulator has no times "
                         "to record")
    rows = []
    for batch in (int(x) for x in args.batches.split(",")):
        for row in measure(batch):
            print(json.dumps({k: row.get(k) for k in ("name", "B", "median_ms", "max_abs_err",
                                                      "kv_bytes", "peak_bytes")}), flush=True)
            rows.append(row)
    try:  # keep the other studies' rows of the suite (SwiftSpec, notebook 18)
        kept = [r for r in results.load(SUITE, results.device_folder(runtime.device_name()))["rows"]
                if r.get("study") != STUDY]
    except (FileNotFoundError, ValueError):
        kept = []
    print("wrote", results.save(SUITE, kept + rows))


if __name__ == "__main__":
    main()
