"""Serial against parallel tree generation on a machine with two GPUs (notebook 20): SwiftSpec's
Table 6 in miniature. `tools/gpu_parallel.sh` runs it, as the capstone bench's parallel section:

    python -m course bench capstone parallel [--smoke] [--one-gpu] [--pair small] [--max-new N] [--out DIR]

Every generation has B = 1 (one prompt of `prompts`), the pair in float16 and the course's kernels
(solutions/), in one run of this command, greedy and sampling:

  autoregressive    the target alone on cuda:0 (`decoder.PlainDecoder`, CUDA graphs);
  serial decoder    the capstone's tree decoder on cuda:0 (`decoder.SpeculativeDecoder`, CUDA graphs),
                    with the fastest of SHAPE's tree and Sequoia's trees of its budget (the row
                    names it: tree, N, width, branch, decoder_steps);
  serial            the parallel code's serial schedule in one process on cuda:0: the draft's d
                    steps after re-rooting, on the critical path (`parallel.run_sides`; each pass
                    a CUDA graph, as in the parallel runs);
  parallel          target on cuda:0, draft on cuda:1, the messages through shared memory
                    (`processes.launch`, transport "shm"); at BEFORE_STEPS also through NCCL and
                    gloo; with --one-gpu (or on a machine with one GPU) both processes sharing
                    cuda:0;
  queued            the queued schedule with the hosts only launching (`queued`: one
                    process, a CUDA stream per side, the messages device-to-device copies; target
                    on cuda:0 and draft on cuda:1, or both on cuda:0 with one GPU), at QUEUED's w and
                    d's (transport "device"); the terms of their rounds (verify_ms to timeline below)
                    come from one more run per prompt, its spans stamped on the streams.

For every method and d: the median run (by time) of REPEATS after a warm-up, per prompt; a row sums
the prompts' median runs. Row fields: the results schema's name, median_ms (mean per generation),
max_abs_err (greedy: the fraction of tokens that differ from autoregressive; sampling: 0.0), B, H,
N (tree size), d (head dim); and mode, steps (SwiftSpec's d), transport, gpus, tokens_per_s,
tokens_per_call, target_calls (per generation), verify_ms (the target's pass and verification,
with the host's work around them), verify_gpu_ms (the pass alone on the GPU, CUDA events; the median),
draft_ms_per_round (the draft's busy time per round), target_idle_ms_per_round (the target
not verifying: the part of drafting and messaging left on the critical path), target_wait_ms_median
(the target's wait between two verifications, the median over rounds), message_ms_median (a
message's way from one process to the other), growth (the parallel
draft's rule for its steps during verification: "likely", `pyspec_ref.parallel_tree`, at every d,
and "best", the rule before it, at BEFORE_STEPS), draft_tree (where the serial schedule's and the
parallel draft's tree lives: "device", `device_side`, at every d, and "host", `sides.DraftSide`,
at BEFORE_STEPS), critical (the parallel draft's steps after each re-root, on the critical path:
0 at every d, CRITICAL at BEFORE_STEPS), width (the nodes per draft step: SHAPE's w, and WIDE's for
the wide variants, each of WIDE's steps after the re-root at each of its d, and the serial schedule
at the same w and d), identical (greedy: equal to autoregressive; where not, first_difference: per
prompt that differs, the first token that does, both tokens and the target's logit gap between
them after the common prefix, `logit_gaps`),
speedup_vs_serial_decoder, and timeline (the first prompt's median run, rounds
1 to TIMELINE_ROUNDS: each side's spans, ms from the run's start).

Writes results/<device>x2/parallel.json (results/<device>/ with one GPU) and parallel.png beside it.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import torch

from course.measure import results

from . import decoder, parallel, processes, weights
from .bench import prompts
from .sides import GROWTHS
from .text import encode

SUITE = "parallel"
PAIR = "medium"  # the capstone's pair (tools/gpu_parallel.sh trains it where it is missing)
PROMPTS = 2
MAX_NEW = 128
# (tree_size, width, branch, the serial decoder's steps): the capstone bench's fastest tree at B = 1
# (results/h100/capstone.json).
SHAPE = (48, 4, 4, 8)
STEPS = (2, 4)  # d = 6 trailed d = 4 in every run on two H200s (results/h200x2/README.md)
BEFORE_STEPS = 4  # the d at which growth "best" (the rule before "likely") is measured too
CRITICAL = (2, 4)  # draft steps after the re-root measured at BEFORE_STEPS besides none
# (width, d, steps after the re-root): the parallel draft at a wider w, so that more of the tree is grown
# while the target verifies (a pass of the one-layer draft costs about the same at 16 queries as at 4),
# at every d and each number of steps after the re-root here; the serial schedule at the same w and d.
# SwiftSpec (§3.1) sets d to r or r + 1, r = the target's pass over a draft pass (5 on two H200s with
# the host's work around each pass, results/h200x2/README.md run h): past it the target waits for the
# draft's last passes. At w = 16 and d = 10 the draft's cache rows (max_nodes + tree_size) are near the
# medium pair's 512 positions.
WIDE = (16, (6, 8, 10), (0, 1, 2))
# Sampling's Gumbel uniforms: run j (results/h200x2/README.md) sent each pass's through a ring of
# pinned buffers, predicting the sampling wait to fall from about 1.0 toward 0.5 ms and the best
# sampling row to reach about 0.6x the serial decoder; it measured 0.93 -> 0.77 ms and 0.47x, wrong:
# the ring's CUDA calls cost the host about 50 us a pass (a one-off profile, the small pair in one
# process: a pass's launch took the host 87 us sampling, 16 greedy). Since then a pool
# (`side_steps.UniformPool`) holds many passes' rows, one copy per refill, the selection's graph
# gathers q too, and the target times one pass in eight (`sides.TIMED_EVERY`) and finds its DFS
# times in two loops. Predicted before run l: the sampling rows' wait falls by 0.1 to 0.2 ms and the
# best sampling row rises to about 3,500 tokens/s (0.52x); the greedy rows gain a few percent (about
# 0.02 ms a round of the target's host work). Measured in run l: sampling 3,803 (0.56x), greedy
# unchanged (0.74x). Since then a draft pass at w = 16 went from 94.6 to 64.9 us on the GPU
# (results/h200/README.md: a ranked pop, one kernel for the children, loops over the live rows,
# gathers by indexing): eight of the old passes (0.76 ms) outlasted a verification (0.60). Predicted
# for the next run: at w = 16, d = 8 the re-root stops waiting for queued passes and the target's
# wait falls by about 0.1 ms, a round of about 0.95 ms, greedy about 0.83x; larger d may now pay.
# Later, the capstone's tree attention took smaller tiles (`backends.TREE_TILES`): a pass at w = 16
# 61 us, and every verification, the serial decoder's too, about 4 us a layer shorter; with the
# draft's span measured alone (`tools/side_spans.py`, notebook 20) the round is about 0.97 ms, 0.81x.
# Measured in run n: a round of about 0.94 ms, greedy 0.83x at d = 10 (the sweep's largest d), sampling
# 0.65x; the target's wait 0.28 ms.
REPEATS = 3
TIMELINE_ROUNDS = 4
# The queued rounds' w and d's. Their round is the longer of the target's pass and the draft's
# passes of a round (notebook 20's two loops): at w = 16 a draft pass is about 0.065 ms on its GPU and
# the medium target's pass 0.47 ms, so d = 4-6 fill it. Predicted before the first two-GPU run from
# the one-GPU runs (results/h200/README.md): d = 6 fastest, a round of about 0.53 ms, 4.6 tokens per
# call, about 1.1x the serial decoder.
QUEUED = (16, (4, 6, 8))
TARGET_SPEEDUP = 1.3  # parallel over the serial decoder, B = 1, greedy (SwiftSpec's Table 6: 275 / 200)
_DTYPES = {False: torch.float32, True: torch.float16}  # on a GPU?


def _median(runs: list) -> object:
    """The median run by time (the lower middle one for an even count), as the capstone's bench."""
    ordered = sorted(runs, key=lambda g: g.seconds)
    return ordered[(len(ordered) - 1) // 2]


def _timeline(generation) -> list[dict]:
    """Each side's spans of rounds 1 .. TIMELINE_ROUNDS (round 0 starts from an empty tree), ms."""
    keep = [e for e in generation.events if 1 <= e["round"] <= TIMELINE_ROUNDS]
    if not keep:
        return []
    t0 = min(e["start"] for e in keep)
    return [dict(side=e["side"], what=e["what"], round=e["round"], start_ms=1e3 * (e["start"] - t0),
                 end_ms=1e3 * (e["end"] - t0)) for e in keep]


def _row(name: str, mode: str, generations: list, plain: list | None, **extra) -> dict:
    """One row from the median generation of each prompt (see the module docstring)."""
    tokens = sum(len(_tokens(g)) for g in generations)
    seconds = sum(g.seconds for g in generations)
    calls = sum(g.target_calls for g in generations)
    row = dict(name=name, mode=mode, B=1, median_ms=1e3 * seconds / len(generations),
               tokens_per_s=tokens / seconds, target_calls=calls / len(generations),
               tokens_per_call=_emitted(generations) / calls, new_tokens=tokens, **extra)
    if mode == "greedy" and plain is not None:
        wrong = sum(sum(a != b for a, b in zip(_tokens(g), _tokens(p), strict=False))
                    + abs(len(_tokens(g)) - len(_tokens(p))) for g, p in zip(generations, plain, strict=True))
        row.update(max_abs_err=wrong / max(sum(len(_tokens(p)) for p in plain), 1), identical=wrong == 0)
        if wrong:
            row["first_difference"] = [
                dict(prompt=i, token=k, plain=_tokens(p)[k], got=_tokens(g)[k])
                for i, (g, p) in enumerate(zip(generations, plain, strict=True))
                if (k := first_difference(_tokens(g), _tokens(p))) is not None]
    else:
        row.update(max_abs_err=0.0)
    if isinstance(generations[0], parallel.ParallelGeneration):
        reroots = max(1, sum(len(g.reused) for g in generations))
        row.update(draft_calls=sum(g.draft_calls for g in generations) / len(generations),
                   reused=sum(sum(g.reused) for g in generations) / reroots)
    if isinstance(generations[0], parallel.ParallelGeneration) and generations[0].events:
        row.update(round_terms(generations))
    return row


def round_terms(generations: list) -> dict:
    """What a round is made of, from the generations' timelines (their events): the verification's
    span and its pass on the GPU, the draft's busy time and the target's idle time per round, the
    target's median wait between two verifications, a message's median way, and the first prompt's
    rounds 1 .. TIMELINE_ROUNDS as the timeline."""
    rounds = sum(len(g.accepted) for g in generations)
    return dict(
        verify_ms=statistics.fmean(g.mean_ms("target", "verify") for g in generations),
        verify_gpu_ms=_median_pass(generations),
        draft_ms_per_round=sum(_busy(g, "draft") for g in generations) / rounds,
        target_idle_ms_per_round=sum(1e3 * g.seconds - _busy(g, "target", "verify") for g in generations)
        / rounds,
        target_wait_ms_median=_median_wait(generations), message_ms_median=_median_message(generations),
        timeline=_timeline(generations[0]))


def draft_pass_ms(row: dict) -> float:
    """A draft pass of a serial-schedule or parallel row, ms, with the host's work around it: the
    draft's busy time per round over its passes per round."""
    return row["draft_ms_per_round"] * row["target_calls"] / row["draft_calls"]


def queued_projection(rows: list[dict], floor_ms: float, like: dict) -> list[dict]:
    """What each greedy parallel row of `like`'s setup (w, growth, draft tree, transport) would take
    if its hosts only launched and each round cost the GPUs' work plus `floor_ms` (the queued
    rounds' overhead, `tools/queued_rounds.py`). A round is then the longer of two loops:

      target's loop  its pass on its GPU, then the draft's passes between the verdict and the next
                     subtree (top-ups, steps after the re-root), then the messages;
      draft's loop   every pass of the draft's round, the d steps ahead included, on its own GPU:
                     when they outlast the target's loop the re-root waits for them.

    A draft pass counts at the serial schedule's measured cost at the same d and w
    (`draft_pass_ms`). Rows whose serial schedule was not measured are left out. Each result:
    steps, critical, on_path (passes a round on the critical path), passes (a round, all),
    target_loop_ms, draft_loop_ms, round_ms, tokens_per_s, speedup (over the serial decoder, when
    the run has one) and measured_speedup."""
    def same_setup(r: dict) -> bool:
        return all(r.get(key) == like.get(key) for key in ("width", "growth", "draft_tree", "transport"))

    serial = {r["steps"]: r for r in rows if r["name"] == "serial" and r["mode"] == "greedy"
              and r["width"] == like["width"] and r.get("draft_tree") == like.get("draft_tree")}
    decoder = next((r for r in rows if r["name"] == "serial decoder" and r["mode"] == "greedy"), None)
    projected = []
    for r in rows:
        if r["name"] != "parallel" or r["mode"] != "greedy" or not same_setup(r) or r["steps"] not in serial:
            continue
        draft_pass = draft_pass_ms(serial[r["steps"]])
        passes = r["draft_calls"] / r["target_calls"]
        on_path = passes - r["steps"]
        target_loop = r["verify_gpu_ms"] + on_path * draft_pass + floor_ms
        draft_loop = passes * draft_pass + floor_ms
        round_ms = max(target_loop, draft_loop)
        speed = 1e3 * r["tokens_per_call"] / round_ms
        projected.append(dict(steps=r["steps"], critical=r.get("critical") or 0, on_path=on_path,
                              passes=passes, target_loop_ms=target_loop, draft_loop_ms=draft_loop,
                              round_ms=round_ms, tokens_per_s=speed,
                              speedup=None if decoder is None else speed / decoder["tokens_per_s"],
                              measured_speedup=r.get("speedup_vs_serial_decoder")))
    return sorted(projected, key=lambda p: (p["steps"], p["critical"]))


def _median_pass(generations: list) -> float | None:
    """The target's pass on its GPU, ms (the median over the rounds timed, one in
    `sides.TIMED_EVERY`; CUDA events around the graph): verify_ms less this is the host's work in a
    verification. None off a GPU."""
    passes = [e["gpu_ms"] for g in generations for e in g.events
              if e["side"] == "target" and e["what"] == "verify" and e.get("gpu_ms") is not None]
    return statistics.median(passes) if passes else None


def _median_wait(generations: list) -> float:
    """The target's wait between two verifications, ms (the median over every round of every
    generation): from the end of its verification of round r to the start of round r + 1's, i.e.
    its reply, the draft's re-root and selection, and the SUBTREE's way back."""
    gaps = []
    for g in generations:
        verifies = sorted((e["start"], e["end"]) for e in g.events
                          if e["side"] == "target" and e["what"] == "verify")
        gaps += [1e3 * (b[0] - a[1]) for a, b in itertools.pairwise(verifies)]
    return statistics.median(gaps) if gaps else 0.0


def _median_message(generations: list) -> float:
    """A message's way from one worker to the other, ms (the median over both directions and every
    round in which the receiver was already waiting): from the end of the sender's step that
    produced it (the draft's selection, the target's verification) to the end of the receiver's
    wait, i.e. encoding, the transport and decoding. Both processes stamp one clock
    (time.perf_counter, the host's monotonic clock)."""
    gaps = []
    for g in generations:
        spans = {(e["side"], e["what"], e["round"]): e for e in g.events}
        for (side, what, r), wait in spans.items():
            if what != "wait":
                continue
            sent = spans.get(("draft", "select", r) if side == "target" else ("target", "verify", r))
            if sent is not None and wait["start"] <= sent["end"]:
                gaps.append(1e3 * (wait["end"] - sent["end"]))
    return statistics.median(gaps) if gaps else 0.0


def first_difference(got: list[int], plain: list[int]) -> int | None:
    """The index of the first token where `got` leaves `plain` (both cut to the shorter), or None."""
    return next((k for k, (a, b) in enumerate(zip(got, plain, strict=False)) if a != b), None)


def logit_gaps(target, texts: list[list[int]], plain: list, rows: list[dict]) -> None:
    """For each greedy row that left plain decoding, the target's logit of plain decoding's token
    less that of the row's, after the prefix where they parted (the reference causal pass,
    `TinyLM.forward`), into its first_difference entries as logit_gap. A gap near zero against the
    logits' rounding is a near-tie, which a tree pass's other order of summation can tip: the rows
    then differ by rounding, not by the protocol."""
    for row in rows:
        for entry in row.get("first_difference", ()):
            prefix = texts[entry["prompt"]] + _tokens(plain[entry["prompt"]])[:entry["token"]]
            with torch.no_grad():
                logits = target(torch.tensor([prefix], device=target.device))[0, -1]
            entry["logit_gap"] = float(logits[entry["plain"]] - logits[entry["got"]])


def _tokens(generation) -> list[int]:
    return generation.tokens[0] if isinstance(generation, decoder.Generation) else generation.tokens


def _emitted(generations: list) -> float:
    """Tokens emitted by all target calls (accepted + 1 per call; plain decoding: one per call)."""
    total = 0
    for g in generations:
        accepted = (g.accepted[0] if g.accepted else []) if isinstance(g, decoder.Generation) else g.accepted
        total += sum(accepted) + len(accepted) if accepted else g.target_calls
    return total


def _busy(generation, side: str, *whats: str) -> float:
    """ms a side spent in spans of these kinds (all but waiting when none are named)."""
    return 1e3 * sum(e["end"] - e["start"] for e in generation.events if e["side"] == side
                     and (e["what"] in whats if whats else e["what"] != "wait"))


def _in_process(run, texts: list[list[int]], repeats: int) -> list:
    """Per prompt: a warm-up, then the median of `repeats` runs of run(prompt)."""
    out = []
    for prompt in texts:
        run(prompt)
        out.append(_median([run(prompt) for _ in range(repeats)]))
    return out


def _launched(job_options: dict, paths: dict, texts: list, modes, steps, repeats: int) -> dict:
    """One two-process launch for every (mode, d, prompt): a warm-up and `repeats` runs each;
    returns {(mode, d): [the median generation per prompt]}."""
    keys = [(mode, d, p) for mode in modes for d in steps for p in range(len(texts))
            for _ in range(1 + repeats)]
    runs = [processes.Run(texts[p], d, mode, 0) for mode, d, p in keys]
    job = processes.Job(paths["target"], paths["draft"], runs, **job_options)
    grouped: dict = {}
    for key, generation in zip(keys, processes.launch(job, timeout=540), strict=True):
        grouped.setdefault(key, []).append(generation)
    return {(mode, d): [_median(grouped[mode, d, p][1:]) for p in range(len(texts))]
            for mode in modes for d in steps}


def _one_gpu_rows(pair: str, texts: list, max_new: int, steps, repeats: int, modes, add, device: str,
                  backend: str, shape: tuple, wide: tuple | None) -> dict:
    """Autoregressive, the serial decoder and the serial schedule on one device; returns, per mode,
    the autoregressive generations and the serial decoder's tokens/s."""
    from course.core import impl as course_impl

    impl = course_impl.bench_impl()
    loaded = weights.load_pair(pair, device=device, dtype=_DTYPES[device != "cpu"])
    target, draft = loaded.target, loaded.draft
    tree_size, width, branch, _ = shape
    tree = dict(tree_size=tree_size, width=width, branch=branch, impl=impl, backend=backend)
    # The serial baselines are built once per mode (on a GPU: their CUDA graphs captured once), as the
    # capstone's own bench builds them, and each run reuses them.
    built = dict(batch=1, max_len=max(len(p) for p in texts) + max_new, impl=impl, backend=backend)
    baselines = {}
    for mode in modes:
        plain_decoder = decoder.PlainDecoder(target, mode=mode, **built)

        def plain_run(prompt, plain_decoder=plain_decoder):
            return plain_decoder.generate([prompt], max_new)

        plain = _in_process(plain_run, texts, repeats)
        add(_row("autoregressive", mode, plain, None, steps=None, transport=None, gpus=1, N=1))
        serial_decoder = _best_serial_decoder(loaded, texts, max_new, repeats, mode, plain, built, shape)
        add(serial_decoder)
        baselines[mode] = (plain, serial_decoder["tokens_per_s"])
        for draft_tree, d, w in _serial_schedules(steps, width, wide):
            sides = parallel.build_sides(target, draft, max_prompt=max(len(p) for p in texts),
                                         max_new_tokens=max_new, steps=d, mode=mode, draft_tree=draft_tree,
                                         **tree | dict(width=w))

            def serial_run(prompt, sides=sides):
                return parallel.run_sides(sides, prompt, schedule="serial")

            add(_row("serial", mode, _in_process(serial_run, texts, repeats), plain, steps=d, transport=None,
                     gpus=1, draft_tree=draft_tree, width=w))
            del sides
    return baselines


def _before(steps) -> list[int]:
    """The d at which the other growth rule, the other draft tree and the steps after the re-root are
    measured too: BEFORE_STEPS if measured, else the first d."""
    return [d for d in steps if d == BEFORE_STEPS] or list(steps[:1])


def _serial_schedules(steps, width: int, wide: tuple | None) -> list[tuple[str, int, int]]:
    """(draft tree, d, w) of the serial schedule's rows: the default tree at every d, the other at
    BEFORE_STEPS (the same tree, pass for pass: only the time differs), and the default tree at the
    wide variants' w and d."""
    before = _before(steps)
    default = parallel.DEFAULT_DRAFT_TREE
    others = [tree for tree in parallel.DRAFT_TREES if tree != default]
    out = [(default, d, width) for d in steps] + [(tree, d, width) for tree in others for d in before]
    return out + ([(default, d, wide[0]) for d in wide[1]] if wide else [])


def _serial_trees(loaded, mode: str, shape: tuple) -> list[tuple[str, dict]]:
    """The serial decoder's candidate trees: the fixed SHAPE and Sequoia's trees (course.capstone.shapes)
    of its budget and of two thirds of it, at its depth (the capstone bench's fastest at B = 1 is
    one of them)."""
    from . import shapes

    tree_size, width, branch, steps = shape
    out = [("fixed", dict(tree_size=tree_size, width=width, branch=branch, steps=steps))]
    rates = shapes.acceptance(loaded, mode)
    for budget in sorted({tree_size, max(2, 2 * tree_size // 3)}):
        try:
            tree = shapes.settings_for("sequoia", rates, mode, tree_size=budget, max_depth=steps)
        except ValueError:  # a pair whose acceptance gives no such tree
            continue
        tree.pop("predicted_tokens_per_call")
        out.append(("sequoia", tree))
    return out


def _best_serial_decoder(loaded, texts: list, max_new: int, repeats: int, mode: str, plain: list, built: dict,
                         shape: tuple) -> dict:
    """The capstone's serial decoder with its fastest tree among `_serial_trees`, as one row (its
    tree in the row: tree, N, width, branch, decoder_steps)."""
    best = None
    for kind, tree in _serial_trees(loaded, mode, shape):
        tree_decoder = decoder.SpeculativeDecoder(loaded.target, loaded.draft, mode=mode, **tree, **built)

        def decoder_run(prompt, tree_decoder=tree_decoder):
            return tree_decoder.generate([prompt], max_new)

        row = _row("serial decoder", mode, _in_process(decoder_run, texts, repeats), plain, steps=None,
                   transport=None, gpus=1, tree=kind, N=tree["tree_size"], width=tree["width"],
                   branch=tree["branch"], decoder_steps=tree["steps"])
        del tree_decoder
        if best is None or row["tokens_per_s"] > best["tokens_per_s"]:
            best = row
    return best


def _queued_rows(pair: str, texts: list, max_new: int, queued_setup: tuple, repeats: int, baselines: dict,
                 add, devices: dict, shape: tuple, backend: str) -> None:
    """The queued rounds' rows (`queued`): one per mode of baselines and d of queued_setup = (w,
    d's), the sides on devices {"target": ..., "draft": ...}."""
    from course.core import impl as course_impl

    from . import queued

    dtype = _DTYPES[devices["target"] != "cpu"]
    target = weights.load_pair(pair, device=devices["target"], dtype=dtype).target
    draft = weights.load_pair(pair, device=devices["draft"], dtype=dtype).draft
    tree_size, _, branch, _ = shape
    width, some = queued_setup
    gpus = len({d for d in devices.values() if d != "cpu"})
    for mode, d in itertools.product(baselines, some):
        sides = queued.build(target, draft, max_prompt=max(len(p) for p in texts), max_new_tokens=max_new,
                             tree_size=tree_size, width=width, steps=d, branch=branch, mode=mode,
                             backend=backend, impl=course_impl.bench_impl())

        def queued_run(prompt, sides=sides):
            return sides.run(prompt, max_new)

        row = _row("queued", mode, _in_process(queued_run, texts, repeats), baselines[mode][0], steps=d,
                   width=width, transport="device", gpus=gpus, growth=parallel.DEFAULT_GROWTH,
                   draft_tree="device", critical=0)
        # The timeline from one more run per prompt, stamped on the streams: the timed runs record none.
        add(row | round_terms([sides.run(prompt, max_new, timeline=True) for prompt in texts]))
        del sides


def measure(pair: str = PAIR, n_prompts: int = PROMPTS, max_new: int = MAX_NEW, steps=STEPS,
            repeats: int = REPEATS, modes=("greedy", "sample"), one_gpu: bool = False,
            log=print, cpu: bool = False, backend: str = "kernels", shape: tuple = SHAPE,
            wide: tuple | None = WIDE, queued: tuple | None = QUEUED) -> list[dict]:
    """Every row (see the module docstring). Needs a GPU, two for the NCCL rows; cpu=True runs the
    same code on the CPU in float32 (its tests, with backend="reference": the times mean nothing).
    steps: the d's of the serial schedule's and the parallel rows (none: the baselines and the queued
    rounds alone, as tools/queued_timeline.py measures them); wide: (w, the d's, the steps after the
    re-root) of the wide variants (WIDE), or None; queued: (w, the d's) of the queued rounds
    (QUEUED), or None."""
    from course.core import impl as course_impl

    gpus = 0 if cpu else torch.cuda.device_count()
    if gpus < 1 and not cpu:
        raise RuntimeError("the parallel bench measures GPUs and this machine has none")
    device = "cuda:0" if gpus else "cpu"
    dtype = str(_DTYPES[gpus > 0]).replace("torch.", "")
    texts = [encode(t) for t in prompts(n_prompts)]
    config = weights.CONFIGS[pair]["target"] if pair in weights.CONFIGS else None
    tree_size, width, branch, _ = shape
    sizes = dict(pair=pair, N=tree_size, width=width, branch=branch, max_new_tokens=max_new)
    if config is not None:
        sizes.update(H=config.n_heads, d=config.head_dim)
    rows: list[dict] = []

    def add(row: dict) -> None:
        rows.append(sizes | row)
        shown = ("name", "mode", "steps", "growth", "draft_tree", "transport", "gpus", "tokens_per_s",
                 "tokens_per_call", "verify_ms", "target_wait_ms_median", "identical")
        log(json.dumps({k: row[k] for k in shown if k in row}))

    baselines = _one_gpu_rows(pair, texts, max_new, steps, repeats, modes, add, device, backend, shape, wide)
    if gpus:
        torch.cuda.empty_cache()
    paths = {role: str(weights.weight_path(pair, role)) for role in ("target", "draft")}
    common = dict(dtypes={"target": dtype, "draft": dtype}, max_new_tokens=max_new, tree_size=tree_size,
                  width=width, branch=branch, impl=course_impl.bench_impl(), backend=backend)
    # Every variant through shared memory (the default transport), the other transports at one d:
    # they change the messages' cost, nothing else.
    before = _before(steps)
    tree, growth = parallel.DEFAULT_DRAFT_TREE, parallel.DEFAULT_GROWTH
    variants = [(tree, growth, 0, steps, width)]
    variants += [(tree, other, 0, before, width) for other in GROWTHS if other != growth]
    variants += [(other, growth, 0, before, width) for other in parallel.DRAFT_TREES if other != tree]
    variants += [(tree, growth, c, before, width) for c in CRITICAL]
    if wide:
        variants += [(tree, growth, c, wide[1], wide[0]) for c in wide[2]]
    default = (tree, growth, 0, before, width)
    launches = []
    if steps and gpus >= 2:
        two = {"target": "cuda:0", "draft": "cuda:1"}
        launches += [(dict(devices=two, transport="shm"), 2, variant) for variant in variants]
        launches += [(dict(devices=two, transport=other), 2, default) for other in ("nccl", "gloo")]
    if steps and (one_gpu or gpus < 2):
        one = dict(devices={"target": device, "draft": device}, transport="shm")
        launches += [(one, min(gpus, 1), variant) for variant in variants]
    for options, used, (draft_tree, rule, critical, some, w) in launches:
        variant = {"growth": rule, "draft_tree": draft_tree, "critical": critical, "width": w}
        measured = _launched(common | options | variant, paths, texts, modes, some, repeats)
        for (mode, d), generations in measured.items():
            add(_row("parallel", mode, generations, baselines[mode][0], steps=d,
                     transport=options["transport"], gpus=used, **variant))
    if queued:
        devices = {"target": device, "draft": "cuda:1" if gpus >= 2 else device}
        _queued_rows(pair, texts, max_new, queued, repeats, baselines, add, devices, shape, backend)
    for row in rows:
        if row["name"] != "autoregressive":
            row["speedup_vs_serial_decoder"] = row["tokens_per_s"] / baselines[row["mode"]][1]
    if any("first_difference" in row for row in rows):
        target = weights.load_pair(pair, device=device, dtype=_DTYPES[gpus > 0]).target
        logit_gaps(target, texts, baselines["greedy"][0], rows)
    return rows


def save(rows: list[dict], gpus: int, folder: Path | None = None) -> Path:
    """results/<device>x<gpus>/parallel.json (results/<device>/ for one GPU, or `folder`) and its
    figure beside it."""
    import matplotlib

    matplotlib.use("Agg")
    from course.measure.plots import save_figures

    from . import parallel_figures

    document = results.document(SUITE, rows)
    if folder is None:
        name = results.device_folder(document["device"]) + (f"x{gpus}" if gpus > 1 else "")
        folder = results.RESULTS / name
    path = Path(folder) / f"{SUITE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document["gpus"] = gpus
    path.write_text(json.dumps(document, indent=1) + "\n")
    save_figures(parallel_figures, document, path.parent)
    return path


def committed_documents(directory: Path = results.RESULTS, suite: str = SUITE) -> list[dict]:
    """Every committed parallel.json (or `suite`'s file, e.g. tools/queued_timeline.py's), the most
    GPUs first (results/<device>x2/ before results/<device>/), then the newest."""
    found = sorted(directory.glob(f"*/{suite}.json"))
    documents = [results.validate(json.loads(path.read_text()), str(path)) for path in found]
    return sorted(documents, key=lambda d: (d.get("gpus", 1), d["date"]), reverse=True)


def load_committed(directory: Path = results.RESULTS) -> dict:
    """The committed parallel.json with the most GPUs (`committed_documents`' first), or
    results.NotMeasuredYet saying how to measure it."""
    documents = committed_documents(directory)
    if not documents:
        raise results.NotMeasuredYet(f"not measured yet: no committed results/<device>x2/{SUITE}.json; "
                                     "tools/gpu_parallel.sh on a machine with two GPUs writes it")
    return documents[0]


def target_met(document: dict) -> tuple[float, bool]:
    """The benchmark target: the fastest parallel greedy run on two GPUs (through the hosts, or
    queued) at least TARGET_SPEEDUP times the serial decoder's tokens/s, greedy output identical to
    plain decoding. Returns (its speed-up, met?)."""
    from .parallel_figures import best_parallel

    rows = document["rows"]
    kinds = ["parallel"] + ["queued"] * any(r["name"] == "queued" for r in rows)
    best = max((best_parallel(rows, "greedy", name) for name in kinds),
               key=lambda r: (r["gpus"], r["tokens_per_s"]))
    speedup = best["speedup_vs_serial_decoder"]
    return speedup, best["gpus"] >= 2 and speedup >= TARGET_SPEEDUP and bool(best.get("identical"))

