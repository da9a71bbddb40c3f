"""Each side of parallel tree generation alone on one GPU, as each runs on its own GPU in a two-GPU
run (notebook 20, §8): where a round's time goes, measured with one GPU.

The two workers (`course.capstone.protocol`) first run in one process, lockstep, to record their
messages. Then each side is replayed alone and answered with the recorded messages:

  draft   SUBTREE out, its growth ahead queued, then the recorded ACCEPTED once `--verify-ms` have
          passed (a verification's length; the host waits it out, so the draft's GPU works alone,
          as on its own GPU). The span from ACCEPTED's arrival to the next SUBTREE out is the
          draft's critical path: the re-root, the passes after it, the selection (and the growth
          ahead, where it outlasts the verification). Its subtrees must equal the recording's,
          and the passes between each re-root and the next subtree are counted.
  target  each recorded SUBTREE in: the span to ACCEPTED out, and the pass's own time on the GPU
          (CUDA events, one verification in `sides.TIMED_EVERY`); the difference is the host's.

On two GPUs a round lasts about the target's span, plus the draft's critical path, plus two
messages (about 0.05 ms each through shared memory in run l, results/h200x2/README.md).

    python3 tools/side_spans.py [--pair small] [--modes greedy sample] [--steps 8 ...]
                                [--verify-ms 0.60 ...] [--out results/h200]

The small pair's draft has the medium pair's configuration (one layer, d_model 128), so its draft
side is the one the two-GPU bench runs; its target is smaller than the medium one (4 layers, not
12), so its pass is shorter but its host's share is the same work. Predicted from the first
measurements made while this tool was written: greedy, a draft critical path of about 0.18 ms with a
draft pass after three re-roots in four (what survives a re-root is mostly fewer than tree_size
rows), and a target host share of about 0.065 ms. Writes side_spans.json (the results schema) with
--out: a row per mode, d and verification length.

Several d and verification lengths show when the growth ahead outlasts the verification: the
re-root then waits for the passes still queued, and the draft's critical path grows by the excess.
Predicted before the first such sweep, greedy at w = 16 with a draft pass of about 65 us: at a
verification of 0.47 ms (the medium target's pass on its GPU, results/h200x2/parallel.json) the
growth of d = 6 (about 0.39 ms) fits, d = 8 (0.52 ms) outlasts it by a few hundredths of a
millisecond and d = 10 (0.65 ms) by about 0.18 ms; at 1.0 ms all three fit.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

SUITE = "side_spans"
TREE_SIZE, WIDTH, STEPS, BRANCH = 48, 16, 8, 4  # the bench's wide draft (parallel_bench.WIDE)
NEW_TOKENS, PROMPTS, REPEATS = 128, 4, 3
VERIFY_MS = 0.60  # the verification the draft waits out by default (the spans of notebook 20's cell)


def record(draft, target, prompt: list[int], seed: int) -> tuple[list, list]:
    """Both workers lockstep over one prompt: (the SUBTREEs sent, with their own copy of q; the replies)."""
    from course.capstone import protocol

    clock = protocol.Timeline()
    draft.start(prompt, seed)
    target.start(prompt, seed + 1)
    drafting = protocol.draft_rounds(draft, draft.steps, "parallel", clock)
    verifying = protocol.target_rounds(target, NEW_TOKENS, None, clock)
    subtrees, replies = [], []
    subtree = next(drafting)
    next(verifying)
    while True:
        if subtree.q is not None:  # q is a view of a buffer the next selection overwrites
            subtree = dataclasses.replace(subtree, q=subtree.q.clone())
        subtrees.append(subtree)
        drafting.send(None)  # the growth ahead
        reply = verifying.send(subtree)
        replies.append(reply)
        try:
            verifying.send(None)
        except StopIteration:
            pass
        try:
            subtree = drafting.send(reply)
        except StopIteration:
            return subtrees, replies


def draft_alone(draft, prompt: list[int], seed: int, subtrees: list, replies: list, verify_ms: float) -> dict:
    """The draft answered with the recorded replies verify_ms after each SUBTREE: its critical spans
    (ms), the passes after each re-root, and whether it sent the recorded subtrees."""
    from course.capstone import protocol

    clock = protocol.Timeline()
    draft.start(prompt, seed)
    torch.cuda.synchronize()
    drafting = protocol.draft_rounds(draft, draft.steps, "parallel", clock)
    subtree = next(drafting)
    spans, passes, same = [], [], True
    for i, reply in enumerate(replies):
        same &= (subtree.parents, subtree.tokens) == (subtrees[i].parents, subtrees[i].tokens)
        if not same:  # the recorded replies no longer answer this draft's subtrees
            break
        arrives = time.perf_counter() + verify_ms / 1e3  # the reply, on the draft's host
        drafting.send(None)
        while time.perf_counter() < arrives:
            pass
        # From the reply's arrival: a host still busy with the growth ahead then counts as waiting.
        began, calls = arrives, draft.calls
        try:
            subtree = drafting.send(reply)
        except StopIteration:
            break
        spans.append(1e3 * (time.perf_counter() - began))
        passes.append(draft.calls - calls)
    parts = collections.defaultdict(list)
    for event in clock.events:
        if event["what"] in ("re-root", "grow", "select") and event["round"] > 0:
            parts[event["what"]].append(1e3 * (event["end"] - event["start"]))
    return dict(spans=spans, passes=passes, same=same, parts=parts)


def target_alone(target, prompt: list[int], seed: int, subtrees: list) -> tuple[list, list]:
    """The target fed the recorded subtrees: (its spans from SUBTREE in to ACCEPTED out, the timed
    passes' GPU times), ms."""
    from course.capstone import protocol

    target.start(prompt, seed + 1)
    torch.cuda.synchronize()
    verifying = protocol.target_rounds(target, NEW_TOKENS, None, protocol.Timeline())
    next(verifying)
    spans, gpu = [], []
    for subtree in subtrees:
        began = time.perf_counter()
        verifying.send(subtree)
        spans.append(1e3 * (time.perf_counter() - began))
        if target.pass_ms is not None:
            gpu.append(target.pass_ms)
        try:
            verifying.send(None)
        except StopIteration:
            break
    return spans, gpu


def measure(pair, mode: str, steps: int, verify_ms: tuple[float, ...], backend: str = "kernels"
            ) -> list[dict]:
    """One mode and d: a row per verification length, each the medians over REPEATS - 1 replays (the
    first warms up) of PROMPTS prompts, all against one recording."""
    from course.capstone import parallel
    from course.capstone.bench import prompts
    from course.capstone.text import encode

    texts = [encode(text) for text in prompts(PROMPTS)]
    draft, target = parallel.build_sides(pair.target, pair.draft, max_prompt=max(map(len, texts)),
                                         max_new_tokens=NEW_TOKENS, tree_size=TREE_SIZE, width=WIDTH,
                                         steps=steps, branch=BRANCH, mode=mode, draft_tree="device",
                                         backend=backend)
    recorded = [record(draft, target, text, seed) for seed, text in enumerate(texts)]
    return [_replayed(draft, target, texts, recorded, mode, steps, verify) for verify in verify_ms]


def _replayed(draft, target, texts: list, recorded: list, mode: str, steps: int, verify_ms: float) -> dict:
    """Both sides replayed alone against the recording, the reply verify_ms after each SUBTREE."""
    spans, passes, target_spans, gpu, parts, same = [], [], [], [], collections.defaultdict(list), True
    for repeat in range(REPEATS):
        for seed, text in enumerate(texts):
            drafted = draft_alone(draft, text, seed, *recorded[seed], verify_ms)
            verified = target_alone(target, text, seed, recorded[seed][0])
            same &= drafted["same"]
            if repeat:
                spans += drafted["spans"]
                passes += drafted["passes"]
                target_spans += verified[0]
                gpu += verified[1]
                for what, times in drafted["parts"].items():
                    parts[what] += times
    if not same:
        raise RuntimeError(f"{mode}: the draft alone sent other subtrees than in lockstep")
    rounds = sum(len(replies) for _, replies in recorded)
    median = statistics.median
    gpu_ms = median(gpu) if gpu else None  # none timed: a CPU, or fewer than TIMED_EVERY verifications
    return dict(name=f"{mode}, each side alone", mode=mode, median_ms=median(spans) + median(target_spans),
                draft_critical_ms=median(spans), draft_critical_p90_ms=sorted(spans)[int(0.9 * len(spans))],
                **{f"draft_{what.replace('-', '')}_ms": median(times) for what, times in parts.items()},
                passes_after_reroot=dict(sorted(collections.Counter(passes).items())),
                target_span_ms=median(target_spans), target_gpu_ms=gpu_ms,
                target_host_ms=None if gpu_ms is None else median(target_spans) - gpu_ms,
                verify_ms_emulated=verify_ms,
                tokens_per_round=PROMPTS * NEW_TOKENS / rounds, rounds=rounds, tree_size=TREE_SIZE,
                width=WIDTH, steps=steps, branch=BRANCH, new_tokens=NEW_TOKENS, prompts=PROMPTS,
                statistic="medians of each side's spans, replayed alone",
                note="median_ms: the target's span plus the draft's critical path, a round without the two "
                     "messages")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="small")
    parser.add_argument("--verify-ms", type=float, nargs="+", default=[VERIFY_MS])
    parser.add_argument("--steps", type=int, nargs="+", default=[STEPS], help="d, the steps ahead")
    parser.add_argument("--modes", nargs="+", default=["greedy", "sample"], choices=["greedy", "sample"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("side_spans measures on a GPU")
    from course.capstone import weights
    from course.measure import results

    pair = weights.load_pair(args.pair, device="cuda", dtype=torch.float16)
    rows = []
    for mode in args.modes:
        for steps in args.steps:
            for row in measure(pair, mode, steps, tuple(args.verify_ms)):
                rows.append(dict(row, pair=args.pair))
                print(json.dumps(rows[-1]), flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{SUITE}.json"
        path.write_text(json.dumps(results.document(SUITE, rows), indent=1) + "\n")
        print(f"saved {path}")


if __name__ == "__main__":
    main()
