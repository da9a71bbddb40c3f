"""The capstone's run on a lent GPU (tools/gpu_capstone.sh calls it):

    python -m course.capstone.gpu_run --out DIR [--until EPOCH_SECONDS] [--budget S] [--pair medium]
    python -m course.capstone.gpu_run --out DIR --smoke

The first is `course.capstone.bench`'s measurement with what a one-try run needs: every row saved
into DIR/capstone.json as soon as it is measured (a setting that fails becomes an "error" row and the
others go on), settings past a deadline recorded as not measured, then the figures beside the JSON
(`course.measure.plots.save_figures`) and the targets met or missed. `python -m course bench
capstone` measures the same rows into results/<device>/.

--smoke: a minute to check, before the long run, that the graphed decoders capture and replay on
this GPU and emit the same tokens as the eager ones and, greedy, as plain decoding (the committed
`small` pair, so that it needs no training).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from course.core import impl as course_impl
from course.core import runtime

from . import bench


def smoke(pair_name: str = "small", out: Path | None = None, log=print) -> bool:
    """Graphed decoders capture and replay, and emit what the eager ones do and (greedy) what plain
    greedy decoding does; a few timings. True if every check passed."""
    from . import weights
    from .decoder import PlainDecoder, SpeculativeDecoder
    from .text import encode

    pair = weights.load_pair(pair_name, dtype=torch.float16)
    encoded = [encode(t) for t in bench.prompts(2)]
    impl = course_impl.bench_impl()
    new = 24
    checks, report = [], {}

    def build(kind, graphs, mode, tree):
        options = dict(batch=2, max_len=bench.PROMPT_CHARS + new, mode=mode, backend="kernels", impl=impl,
                       graphs=graphs)
        if kind == "plain":
            return PlainDecoder(pair.target, **options)
        bs, w, k, s = tree
        return SpeculativeDecoder(pair.target, pair.draft, tree_size=bs, width=w, branch=k, steps=s,
                                  **options)

    cases = [("plain", "greedy", None), ("tree", "greedy", (8, 2, 4, 4)), ("chain", "greedy", (5, 1, 1, 4)),
             ("tree", "sample", (8, 2, 4, 4)), ("plain", "sample", None)]
    plain_tokens = None
    for kind, mode, tree in cases:
        try:
            t0 = time.perf_counter()
            eager = build(kind, False, mode, tree).generate(encoded, new, seed=3)
            t1 = time.perf_counter()
            graphed = build(kind, True, mode, tree)
            t2 = time.perf_counter()
            first = graphed.generate(encoded, new, seed=3)
            again = graphed.generate(encoded, new, seed=3)
            same = first.tokens == eager.tokens == again.tokens
            if kind == "plain" and mode == "greedy":
                plain_tokens = first.tokens
            as_plain = mode != "greedy" or first.tokens == plain_tokens
            checks.append(same and as_plain)
            report[f"{kind} {mode}"] = dict(graphed_equals_eager=same, equals_plain_greedy=as_plain,
                                            eager_s=t1 - t0, build_s=t2 - t1, graphed_s=again.seconds,
                                            eager_tokens_per_s=eager.tokens_per_s,
                                            graphed_tokens_per_s=again.tokens_per_s,
                                            tokens_per_call=again.tokens_per_call)
            log(f"{kind:6s} {mode:6s} graphed == eager: {same}, == plain greedy: {as_plain}; "
                f"{eager.tokens_per_s:8.1f} tokens/s eager, {again.tokens_per_s:8.1f} graphed "
                f"(capture {t2 - t1:.1f} s), {again.tokens_per_call:.2f} tokens per call")
        except Exception as error:  # report every case, whatever one of them does
            import traceback

            traceback.print_exc()
            checks.append(False)
            report[f"{kind} {mode}"] = dict(error=f"{type(error).__name__}: {error}")
            log(f"{kind} {mode}: FAILED {type(error).__name__}: {error}")
    ok = all(checks)
    log(f"smoke {'passed' if ok else 'FAILED'} ({runtime.device_name()}, pair {pair_name}, impl {impl})")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "capstone_smoke.json").write_text(json.dumps(dict(ok=ok, pair=pair_name, cases=report),
                                                            indent=1))
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course.capstone.gpu_run",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where capstone.json and its figures go")
    parser.add_argument("--pair", default=bench.PAIR, help=f"the trained pair (default {bench.PAIR})")
    parser.add_argument("--budget", type=float, default=bench.BUDGET_S,
                        help="seconds for the whole measurement")
    parser.add_argument("--until", type=float, default=None,
                        help="a wall-clock deadline (seconds since the epoch): the budget ends 20 s before")
    parser.add_argument("--max-new", type=int, default=bench.MAX_NEW, help="tokens per prompt")
    parser.add_argument("--repeats", type=int, default=bench.REPEATS, help="timed generations per setting")
    parser.add_argument("--modes", default="greedy,sample:1.0,sample:0.6",
                        help="modes to measure: greedy and sample:TEMPERATURE, comma-separated")
    parser.add_argument("--final-draft-only", action="store_true", help="not the draft's snapshots")
    parser.add_argument("--smoke", action="store_true",
                        help="instead, a one-minute check of the graphed decoders (default pair: small)")
    args = parser.parse_args(argv)
    if runtime.SIMULATOR:
        print("the capstone's GPU run needs a GPU; this machine runs the simulator", file=sys.stderr)
        return 2
    if args.smoke:
        return 0 if smoke(args.pair if args.pair != bench.PAIR else "small", args.out) else 1
    from course.measure.plots import save_figures

    from . import figures, weights

    budget = args.budget if args.until is None else min(args.budget, args.until - time.time() - 20)
    print(f"capstone bench: pair {args.pair}, {runtime.device_name()}, budget {budget:.0f} s", flush=True)
    pair = weights.load_pair(args.pair, dtype=torch.float16)
    args.out.mkdir(parents=True, exist_ok=True)
    drafts = [("final", pair.draft)] if args.final_draft_only else bench.drafts_of(args.pair)
    modes = [(m, 1.0) if m == "greedy" else ("sample", float(m.split(":")[1])) for m in args.modes.split(",")]
    bench.Bench(pair, args.out, budget, args.max_new, args.repeats, drafts=drafts, modes=modes).run()
    document = json.loads((args.out / f"{bench.SUITE}.json").read_text())
    try:
        import matplotlib

        matplotlib.use("Agg")
        for path in save_figures(figures, document, args.out):
            print(f"wrote {path}")
    except Exception as error:  # the JSON is what matters; `python -m course figures` can draw later
        print(f"figures failed: {error}", file=sys.stderr)
    print(figures.summary(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
