"""SwiftSpec's parallel tree generation with the capstone's models (notebook 20), in one process:
both workers of `course.capstone.protocol` run one after the other in the order the messages
impose (lockstep). With schedule="serial" this is serial tree generation with the same code (the
draft steps after re-rooting); with "parallel" it produces exactly the tokens of the two-process
run (`course.capstone.processes`: each side has its own random generator, and the number of draft
steps per round is fixed), so it is what the tests of exactness run.

Timing: each side stamps its work with time.perf_counter (CLOCK_MONOTONIC on Linux: one clock for
both processes of a two-process run); each stamp follows a read of a result by the host (the
draft's top-k, the target's accepted path), so the GPU's work is inside it. The timeline of
notebook 20 is these stamps.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from . import decoder, wire
from .device_side import DeviceDraftSide
from .protocol import Timeline, draft_rounds, run_lockstep, target_rounds
from .sides import DraftSide, TargetSide

SCHEDULES = ("parallel", "serial", "queued")  # pyspec_ref.parallel_tree's
DEFAULT_STEPS = 2  # SwiftSpec's d: draft steps per round during verification
DEFAULT_GROWTH = "likely"  # how those steps pick their candidates (sides.GROWTHS)
# Where the draft keeps its tree: the same tree, pass for pass (the tests hold them equal). On the
# device every pass, its bookkeeping included, is one CUDA graph of the course's Triton kernels, and
# the growth during verification is queued without a wait: on two H200s it made the serial schedule
# 1.3-1.9x and parallel generation 1.2x faster than the host's tree (results/h200x2/README.md, runs c
# and e).
DRAFT_TREES = {"host": DraftSide, "device": DeviceDraftSide}
DEFAULT_DRAFT_TREE = "device"


@dataclasses.dataclass
class ParallelGeneration:
    """What one generation produced and cost (B = 1)."""

    tokens: list[int]
    seconds: float  # from both sides prefilled to the last verification
    target_calls: int
    draft_calls: int
    accepted: list[int]  # draft tokens accepted per round
    reused: list[bool]  # per re-root: the next token's subtree was in the draft tree
    events: list[dict]  # the timeline, times in seconds from the start
    mode: str
    schedule: str
    steps: int
    processes: int  # 1: lockstep in this process, 2: one process per side

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def tokens_per_call(self) -> float:
        """Tokens emitted per target call (accepted + 1, before the last round's truncation)."""
        return (sum(self.accepted) + len(self.accepted)) / len(self.accepted)

    def mean_ms(self, side: str, *whats: str) -> float:
        """Mean duration of a side's spans of these kinds (e.g. "target", "verify"), in ms."""
        spans = [e["end"] - e["start"] for e in self.events if e["side"] == side and e["what"] in whats]
        return 1e3 * sum(spans) / len(spans) if spans else 0.0

    def summary(self) -> str:
        where = "two processes" if self.processes == 2 else "one process"
        return (f"{self.schedule} tree generation ({self.mode}, d = {self.steps}, {where}): "
                f"{self.new_tokens} tokens in {self.seconds:.3f} s = {self.tokens_per_s:.1f} tokens/s, "
                f"{self.target_calls} target calls ({self.tokens_per_call:.2f} tokens per call), "
                f"{self.draft_calls} draft calls, "
                f"{sum(self.reused)} of {len(self.reused)} re-roots kept a subtree")


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def check_prompt(prompt, vocab_size: int) -> list[int]:
    prompts = decoder.check_prompts(prompt, vocab_size)
    if len(prompts) != 1:
        raise ValueError(f"parallel tree generation takes one prompt (B = 1), got {len(prompts)}")
    return prompts[0]


def check_pair(target_config, draft_config, target_dtype, draft_dtype) -> None:
    """A pair that cannot work together, refused before anything runs (wire.PairMismatch)."""
    problems = []
    if target_config.vocab_size != draft_config.vocab_size:
        problems.append(f"vocab_size: target {target_config.vocab_size}, draft {draft_config.vocab_size}")
    if target_dtype != draft_dtype:
        problems.append(f"dtype: target {str(target_dtype).replace('torch.', '')}, draft "
                        f"{str(draft_dtype).replace('torch.', '')}")
    if problems:
        raise wire.PairMismatch("the target and the draft do not match: " + "; ".join(problems))


def build_sides(target, draft, *, max_prompt: int, max_new_tokens: int, tree_size: int = 8, width: int = 2,
                steps: int = DEFAULT_STEPS, branch: int | None = None, mode: str = "greedy",
                backend: str = "kernels", impl: str | None = None, graphs: bool | None = None,
                growth: str = DEFAULT_GROWTH, draft_tree: str = DEFAULT_DRAFT_TREE, only: str | None = None
                ) -> tuple[DraftSide | DeviceDraftSide | None, TargetSide | None]:
    """Both sides for prompts of up to max_prompt tokens (checked: the pair, the settings); on a GPU
    their CUDA graphs are captured here, so build them once and `run_sides` many times. only:
    "draft" or "target" builds that side alone (None in the other's place), for sides on two GPUs
    of one process, each built under its own device (`queued.build`)."""
    if only not in (None, "draft", "target"):
        raise ValueError(f"only must be None, 'draft' or 'target', got {only!r}")
    cfg = decoder.settings(tree_size, width, branch, mode=mode)
    decoder._positive_int(max_new_tokens, "max_new_tokens")
    check_pair(target.config, draft.config, target.dtype, draft.dtype)
    sizes = dict(max_prompt=max_prompt, max_new_tokens=max_new_tokens, backend=backend, impl=impl,
                 graphs=graphs)
    drafting = draft_side(draft_tree)(draft, cfg, steps, growth=growth, **sizes) if only != "target" else None
    return drafting, TargetSide(target, cfg, **sizes) if only != "draft" else None


def draft_side(draft_tree: str):
    """The draft side's class for `draft_tree` ("device" or "host", see DRAFT_TREES)."""
    if draft_tree not in DRAFT_TREES:
        raise ValueError(f"draft_tree must be one of {tuple(DRAFT_TREES)}, got {draft_tree!r}")
    return DRAFT_TREES[draft_tree]


@torch.no_grad()
def check_critical(critical, schedule: str) -> int:
    """critical: draft steps after the re-root in the parallel schedule (`protocol.draft_rounds`)."""
    if isinstance(critical, bool) or not isinstance(critical, int) or critical < 0 or (
            critical and schedule != "parallel"):
        raise ValueError(f"critical must be an int >= 0, and 0 unless schedule is 'parallel' (the serial "
                         f"schedule takes all its steps after the re-root), got {critical!r}")
    return critical


def run_sides(sides: tuple[DraftSide, TargetSide], prompt, *, schedule: str = "parallel", seed: int = 0,
              eos: int | None = None, critical: int = 0) -> ParallelGeneration:
    """One generation with built sides, both workers in this process (lockstep, see the module
    docstring); the draft's generator starts from `seed`, the target's from seed + 1; critical: the
    parallel schedule's draft steps after each re-root (`protocol.draft_rounds`)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    check_critical(critical, schedule)
    d_side, t_side = sides
    if schedule == "queued" and not isinstance(d_side, DeviceDraftSide):
        raise ValueError("the queued schedule needs the draft's tree on the device (draft_tree='device')")
    prompt = check_prompt(prompt, t_side.model.config.vocab_size)
    d_side.start(prompt, seed)
    t_side.start(prompt, seed + 1)
    sync(t_side.model.device)
    clock = Timeline()
    t0 = time.perf_counter()
    reused, (tokens, accepted) = run_lockstep(draft_rounds(d_side, d_side.steps, schedule, clock, critical),
                                              target_rounds(t_side, t_side.max_new_tokens, eos, clock))
    sync(t_side.model.device)
    seconds = time.perf_counter() - t0
    return ParallelGeneration(tokens, seconds, t_side.calls, d_side.calls, accepted, reused,
                              relative_events(clock.events, t0), d_side.cfg.mode, schedule, d_side.steps, 1)


def generate(target, draft, prompt, max_new_tokens: int, *, tree_size: int = 8, width: int = 2,
             steps: int = DEFAULT_STEPS, branch: int | None = None, mode: str = "greedy",
             schedule: str = "parallel", seed: int = 0, backend: str = "kernels", impl: str | None = None,
             eos: int | None = None, graphs: bool | None = None, growth: str = DEFAULT_GROWTH,
             draft_tree: str = DEFAULT_DRAFT_TREE, critical: int = 0) -> ParallelGeneration:
    """One generation, both workers in this process (lockstep, see the module docstring); one
    prompt (a token-id list). steps: SwiftSpec's d, draft steps per round (during verification, or
    after re-rooting for schedule="serial"); critical: steps after each re-root in the parallel
    schedule too. Greedy output equals the target's greedy decoding; the
    parallel schedule's tokens equal `launch`'s for the same settings. Builds the sides for this
    prompt: to run many, `build_sides` once and `run_sides`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    check_critical(critical, schedule)
    prompt = check_prompt(prompt, target.config.vocab_size)
    sides = build_sides(target, draft, max_prompt=len(prompt), max_new_tokens=max_new_tokens,
                        tree_size=tree_size, width=width, steps=steps, branch=branch, mode=mode,
                        backend=backend, impl=impl, graphs=graphs, growth=growth, draft_tree=draft_tree)
    return run_sides(sides, prompt, schedule=schedule, seed=seed, eos=eos, critical=critical)


def relative_events(events: list[dict], t0: float) -> list[dict]:
    return [dict(e, start=e["start"] - t0, end=e["end"] - t0) for e in events]


def generate_report(texts, *, pair: str | None = None, max_new_tokens: int | None = None, tree_size: int = 8,
                    width: int = 2, steps: int = DEFAULT_STEPS, mode: str = "greedy", seed: int = 0,
                    backend: str = "kernels", impl: str | None = None, critical: int = 0) -> str:
    """What `python -m course generate --parallel` prints: the continuation, the parallel run's
    tokens/s and tokens per target call, and (greedy) whether it equals plain decoding; on a GPU
    also serial tree generation with the same code on one GPU, and the speed-up. critical: the
    parallel draft's steps after each re-root (`protocol.draft_rounds`).

    Needs two GPUs on a GPU machine (one process and one GPU per model); in the simulator the two
    processes run on the CPU and talk through gloo (the tiny pair), which shows the protocol at
    work, not its speed."""
    from course.core import runtime

    from . import weights
    from .processes import Run, launch, pair_job
    from .text import decode

    texts = [texts] if isinstance(texts, str) else list(texts)
    if len(texts) != 1:
        raise ValueError(f"--parallel takes one --prompt (B = 1), got {len(texts)}")
    if runtime.on_gpu() and torch.cuda.device_count() < 2:
        raise ValueError(f"--parallel runs the target and the draft on two GPUs, one process each, and "
                         f"this machine has {torch.cuda.device_count()}. On one GPU, `python -m course "
                         "generate` runs the serial tree decoder; tools/gpu_parallel.sh --one-gpu measures "
                         "both processes sharing one GPU")
    pair = pair or runtime.pick(sim="tiny", gpu="small")
    max_new_tokens = max_new_tokens if max_new_tokens is not None else runtime.pick(sim=12, gpu=64)
    prompt = decoder.check_texts(texts)[0]
    decoder.settings(tree_size, width, None, mode=mode)
    check_critical(critical, "parallel")
    options = dict(tree_size=tree_size, width=width, max_new_tokens=max_new_tokens, backend=backend,
                   impl=impl, critical=critical)
    run = Run(prompt, steps, mode, seed)
    warm = [run] if runtime.on_gpu() else []  # Triton compiles on first use: a warm-up run, untimed
    got = launch(pair_job(pair, [*warm, run], **options))[-1]
    lines = [f"pair {pair} ({runtime.MODE}), mode {mode}, tree size {tree_size}, width {width}, d = {steps}, "
             f"{critical} step{'s' * (critical != 1)} after each re-root",
             f"{texts[0]!r} -> {decode(got.tokens)!r}", got.summary()]
    device = "cuda:0" if runtime.on_gpu() else "cpu"
    dtype = torch.float16 if runtime.on_gpu() else torch.float32
    models = weights.load_pair(pair, device=device, dtype=dtype)
    if runtime.on_gpu():
        same = dict(tree_size=tree_size, width=width, steps=steps, mode=mode, seed=seed, backend=backend,
                    impl=impl)
        generate(models.target, models.draft, prompt, max_new_tokens, schedule="serial", **same)
        serial = generate(models.target, models.draft, prompt, max_new_tokens, schedule="serial", **same)
        lines += [serial.summary() + " (one GPU)",
                  f"parallel / serial: {got.tokens_per_s / serial.tokens_per_s:.2f}x tokens/s"]
    else:
        lines.append("(the simulator: two CPU processes talking through gloo; the times say nothing about "
                     "GPUs)")
    if mode == "greedy":
        plain = decoder.autoregressive(models.target, [prompt], max_new_tokens, backend=backend, impl=impl)
        lines.append(f"greedy output identical to plain decoding: {plain.tokens[0] == got.tokens}")
    return "\n".join(lines)
