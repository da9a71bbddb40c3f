"""A minute's check, before the capstone's long GPU run, that its CUDA graphs hold:

    python -m course bench capstone graphs --out DIR        (tools/gpu_capstone.sh --smoke)

Each case builds a decoder eagerly and with graphs (`decoder.PlainDecoder` / `SpeculativeDecoder`),
on the committed `small` pair (it needs no training), and checks that the graphed decoder captures,
replays twice and emits the eager one's tokens and, greedy, plain greedy decoding's. One row per case
(the results schema: median_ms the graphed generation's time, max_abs_err the fraction of its tokens
that differ from the eager one's); a case that fails is reported, the others still run, and the check
then raises.
"""

from __future__ import annotations

import time

import torch

from course.core import impl as course_impl
from course.core import runtime

from . import bench

NEW_TOKENS = 24
# (kind, mode, (tree_size, width, branch, steps) or None for plain decoding)
CASES = (("plain", "greedy", None), ("tree", "greedy", (8, 2, 4, 4)), ("chain", "greedy", (5, 1, 1, 4)),
         ("tree", "sample", (8, 2, 4, 4)), ("plain", "sample", None))


def _build(pair, kind: str, graphs: bool, mode: str, tree):
    from .decoder import PlainDecoder, SpeculativeDecoder

    options = dict(batch=2, max_len=bench.PROMPT_CHARS + NEW_TOKENS, mode=mode, backend="kernels",
                   impl=course_impl.bench_impl(), graphs=graphs)
    if kind == "plain":
        return PlainDecoder(pair.target, **options)
    bs, w, k, s = tree
    return SpeculativeDecoder(pair.target, pair.draft, tree_size=bs, width=w, branch=k, steps=s, **options)


def _case(pair, encoded, kind: str, mode: str, tree, plain_tokens) -> dict:
    """One case's row: eager, then graphed (built, then generating twice)."""
    t0 = time.perf_counter()
    eager = _build(pair, kind, False, mode, tree).generate(encoded, NEW_TOKENS, seed=3)
    t1 = time.perf_counter()
    graphed = _build(pair, kind, True, mode, tree)
    t2 = time.perf_counter()
    first = graphed.generate(encoded, NEW_TOKENS, seed=3)
    again = graphed.generate(encoded, NEW_TOKENS, seed=3)
    same = first.tokens == eager.tokens == again.tokens
    as_plain = mode != "greedy" or plain_tokens is None or first.tokens == plain_tokens
    return dict(name=kind, mode=mode, B=len(encoded), median_ms=1e3 * again.seconds,
                max_abs_err=bench.mismatch(again.tokens, eager.tokens), graphed_equals_eager=same,
                equals_plain_greedy=as_plain, passed=same and as_plain, eager_s=t1 - t0, build_s=t2 - t1,
                eager_tokens_per_s=eager.tokens_per_s, graphed_tokens_per_s=again.tokens_per_s,
                tokens_per_call=again.tokens_per_call, tokens=first.tokens)


def rows(pair_name: str = "small", log=print) -> list[dict]:
    """Every case's row (see the module docstring); ValueError after the last case if any failed."""
    from . import weights
    from .text import encode

    pair = weights.load_pair(pair_name, dtype=torch.float16)
    encoded = [encode(t) for t in bench.prompts(2)]
    found, plain_tokens = [], None
    for kind, mode, tree in CASES:
        try:
            row = _case(pair, encoded, kind, mode, tree, plain_tokens)
        except Exception as error:  # report every case, whatever one of them does
            import traceback

            traceback.print_exc()
            row = dict(name=kind, mode=mode, B=len(encoded), median_ms=None, max_abs_err=None, passed=False,
                       error=f"{type(error).__name__}: {error}")
        if (kind, mode) == ("plain", "greedy") and row["passed"]:
            plain_tokens = row["tokens"]
        row.pop("tokens", None)
        found.append(dict(row, pair=pair_name, tree=tree))
        log(f"{kind:6s} {mode:6s} " + (f"FAILED {row['error']}" if "error" in row else
            f"graphed == eager: {row['graphed_equals_eager']}, "
            f"== plain greedy: {row['equals_plain_greedy']}; "
            f"{row['eager_tokens_per_s']:8.1f} tokens/s eager, {row['graphed_tokens_per_s']:8.1f} graphed "
            f"(capture {row['build_s']:.1f} s), {row['tokens_per_call']:.2f} tokens per call"))
    failed = [f"{r['name']} {r['mode']}" for r in found if not r["passed"]]
    log(f"graphs check {'FAILED: ' + ', '.join(failed) if failed else 'passed'} ({runtime.device_name()}, "
        f"pair {pair_name}, impl {course_impl.bench_impl()})")
    if failed:
        raise ValueError(f"the graphed decoders failed their check: {', '.join(failed)} (rows above)")
    return found
