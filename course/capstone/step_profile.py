"""Where a draft step's time goes: one query (a chain) against several (a tree), kernel by kernel.

    python -m course bench capstone step_profile [--pair medium] [--modes greedy] [--out DIR]

A draft step of the capstone's 1-layer draft is a few dozen small kernels, each shorter than its
launch, so its time is set by how many kernels it runs and how long each one lasts, not by its
arithmetic (notebook 19: the draft is latency-bound). This module answers what a step of `width`
queries costs beyond a step of one query:

* each draft step's replay time as a CUDA graph (`course.measure.timing.bench_graphed`), and the
  whole round's draft steps captured as ONE graph (how much the launches between steps cost);
* the kernels of one step, eagerly under torch.profiler, with their device times, for the chain
  and for the tree, side by side by kernel name;
* the verification phase (the target's pass and the walk) as its graph;
* all of it with RoPE and SwiGLU as torch's kernels and as `model_kernels`' fused ones.

Its rows (`rows`, GPU only) go to results/<device>/step_profile.json, a results document of suite
"step_profile": one row per (shape, mode, fused or not), its median_ms the graphed time of draft step 1.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from course.core import impl as course_impl
from course.core import runtime

from . import bench

SUITE = "step_profile"
SHAPES = {"chain": (9, 1, 1, 8), "tree": (48, 4, 4, 8)}  # (tree_size, width, branch, steps)


def _decoder(pair, shape, mode: str, graphs: bool):
    from .decoder import SpeculativeDecoder

    bs, width, branch, steps = shape
    return SpeculativeDecoder(pair.target, pair.draft, batch=1, max_len=bench.PROMPT_CHARS + 64, mode=mode,
                              tree_size=bs, width=width, branch=branch, steps=steps, backend="kernels",
                              impl=course_impl.bench_impl(), graphs=graphs)


def _ready(decoder, encoded) -> None:
    """A decoder in the middle of a generation: a prefix in its caches, a tree at its root."""
    decoder.generate(encoded, 16, seed=1)
    decoder._prefill_all(encoded)  # noqa: SLF001  (profiling reaches into the loop's phases)
    decoder.start(encoded, 16, seed=2)


def kernel_times(decoder, step: int) -> dict[str, float]:
    """Device microseconds per kernel name of one eager draft step (summed over its launches)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        decoder._draft_step(step)  # noqa: SLF001
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decoder._draft_step(step)  # noqa: SLF001
        torch.cuda.synchronize()
    times = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name[:80]] += event.device_time_total
    return dict(times)


def graphed_step_times(decoder) -> dict:
    """Median ms of each draft step as its own graph, of all of them back to back, and of all of them
    captured as one graph."""
    from course.measure.timing import bench, bench_graphed

    per_step = [bench(step) for step in decoder.draft_steps]

    def all_steps():
        for s in range(decoder.plan.steps):
            decoder._draft_step(s)  # noqa: SLF001

    back_to_back = bench(lambda: [s() for s in decoder.draft_steps])
    return {"per_step_ms": per_step, "steps_back_to_back_ms": back_to_back,
            "steps_as_one_graph_ms": bench_graphed(all_steps), "verify_ms": bench(decoder.verify)}


def profile_pair(pair_name: str, modes=("greedy", "sample")) -> dict:
    from . import weights
    from .text import encode

    pair = weights.load_pair(pair_name, dtype=torch.float16)
    encoded = [encode(bench.prompts(1)[0])]
    report = {"pair": pair_name, "device": runtime.device_name(), "shapes": {}}
    for fused in (False, True):  # RoPE and SwiGLU as torch's kernels, then as `model_kernels`
        pair.target.fused_elementwise = pair.draft.fused_elementwise = fused
        for mode in modes:
            for name, shape in SHAPES.items():
                key = f"{name} {mode}{' fused' if fused else ''}"
                report["shapes"][key] = _profile_shape(pair, shape, mode, encoded)
                report["shapes"][key]["fused_elementwise"] = fused
                _print(key, report["shapes"][key])
    pair.target.fused_elementwise = pair.draft.fused_elementwise = None
    for chain, tree, label in comparisons(report["shapes"], modes):
        _compare(report["shapes"][chain], report["shapes"][tree], label)
    return report


def comparisons(shapes: dict, modes) -> list[tuple[str, str, str]]:
    """(chain key, tree key, label) of each mode profiled, unfused then fused: the pairs of step
    profiles printed side by side, kernel by kernel."""
    return [(f"chain {mode}{suffix}", f"tree {mode}{suffix}", f"{mode}{suffix}")
            for suffix in ("", " fused") for mode in modes if f"chain {mode}{suffix}" in shapes]


def _profile_shape(pair, shape, mode: str, encoded) -> dict:
    eager = _decoder(pair, shape, mode, graphs=False)
    _ready(eager, encoded)
    kernels = kernel_times(eager, 1)
    graphed = _decoder(pair, shape, mode, graphs=True)
    _ready(graphed, encoded)
    return {"shape": shape, "kernels_step1_us": kernels, "kernel_count_step1": len(kernels),
            "kernel_sum_step1_us": sum(kernels.values()), **graphed_step_times(graphed)}


def _print(key: str, row: dict) -> None:
    print(f"{key:24s} step 1: {row['kernel_count_step1']} kernel names, "
          f"{row['kernel_sum_step1_us']:.1f} us of kernels; graphed steps (ms) "
          f"{[round(t, 4) for t in row['per_step_ms']]}; all steps as one graph "
          f"{row['steps_as_one_graph_ms']:.4f} ms vs {row['steps_back_to_back_ms']:.4f}; verify "
          f"{row['verify_ms']:.4f} ms", flush=True)


def _compare(chain: dict, tree: dict, label: str) -> None:
    names = sorted(set(chain["kernels_step1_us"]) | set(tree["kernels_step1_us"]),
                   key=lambda n: -tree["kernels_step1_us"].get(n, 0.0))
    print(f"{'kernel (' + label + ', step 1)':80s} {'chain us':>9s} {'tree us':>9s}")
    for n in names:
        chain_us, tree_us = chain["kernels_step1_us"].get(n, 0.0), tree["kernels_step1_us"].get(n, 0.0)
        print(f"{n:80s} {chain_us:9.2f} {tree_us:9.2f}")


def rows(pair_name: str, modes=("greedy", "sample")) -> list[dict]:
    """The profile of `profile_pair`, one results row per (shape, mode, fused or not)."""
    report = profile_pair(pair_name, tuple(modes))
    return [dict(row, name=key.split()[0], mode=key.split()[1], pair=report["pair"], key=key,
                 median_ms=row["per_step_ms"][1], statistic="draft step profile")
            for key, row in report["shapes"].items()]
