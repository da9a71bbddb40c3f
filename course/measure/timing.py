"""Timing kernels honestly: warm up, then the median of many runs, on a GPU only.

The simulator's times say nothing about a GPU, so `bench` refuses to run there;
notebooks in the simulator plot the committed measurements instead
(`course.measure.results.load`).
"""

from __future__ import annotations

from collections.abc import Callable

from course.core import runtime


class NoTimingInSimulator(RuntimeError):
    """Timings are only meaningful on a GPU."""


def bench(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 200) -> float:
    """Median time of fn() in milliseconds (triton.testing.do_bench: CUDA events, warm-up first).

    Time random inputs, never zeros, and put the baselines in the same run.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    for name, value in (("warmup_ms", warmup_ms), ("rep_ms", rep_ms)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name} must be a positive number of milliseconds, got {value!r}")
    if runtime.SIMULATOR:
        raise NoTimingInSimulator(
            "bench() needs a GPU: the simulator's times say nothing about one. "
            "Read the committed measurements with course.measure.results.load(suite) instead.")
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def bench_graphed(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 200) -> float:
    """`bench` of fn captured as a CUDA graph (`graphed`): one launch per run, whatever fn launches.

    For calls whose GPU work lasts tens of microseconds: launched from Python, such a call can
    take the host longer than the GPU, and then bench times the host (on the H100, DeFT's
    two-kernel runner took 82-96 us to launch against 24-40 us of GPU work, and five repeated
    medians of one call ranged 40-76 us; results/h100/logs/deft_diag_launch.log).
    """
    return bench(graphed(fn), warmup_ms=warmup_ms, rep_ms=rep_ms)


def graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """fn captured in a CUDA graph (torch.cuda.CUDAGraph): calling the result replays all of fn's
    kernels with one launch and returns the outputs fn returned at capture (the same tensors).

    For timing work whose kernels are shorter than their launches: a few microseconds of GPU work
    behind tens of microseconds of Python and driver calls measures the host, not the kernels.
    Production decoders run such steps as graphs (fn must not synchronise with the host).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if runtime.SIMULATOR:
        raise NoTimingInSimulator("graphed() needs a GPU: the simulator has no CUDA graphs")
    import torch

    side = torch.cuda.Stream()  # warm up (compile, allocate) off the capturing stream, as PyTorch asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()

    def replay():
        graph.replay()
        return outputs

    replay.graph = graph  # keeps the graph (and its memory pool) alive with the function
    return replay
