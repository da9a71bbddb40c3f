"""The capstone's measurements: `python -m course bench capstone` on a GPU writes
results/<device>/capstone.json (its figure: `python -m course figures capstone`).

The small pair (`weights.load_pair("small")`), target and draft in float16, decodes BATCH held-out
prompts (`prompts`) for MAX_NEW tokens each, greedy, with the course's kernels (solutions/; in a
hand-out without solutions/, the student's lessons/: `course.core.impl.bench_impl`):

  figure "speed"    plain autoregressive decoding with the target alone (`decoder.autoregressive`,
                    `emssd.unpadded_attention` with counts = 1) and tree speculative decoding
                    (`decoder.speculative`) for every tree size bs in TREE_SIZES and width w in
                    WIDTHS (w <= bs): tokens per second, draft tokens accepted per target call,
                    speedup over the baseline.
  figure "drafts"   bs = 8, w = 2 with each draft of `weights.load_drafts("small")` (snapshots of the
                    draft during its training, worst first): acceptance against draft quality.
  figure "sample"   sampling mode at bs = 8, w = 2 against sampled plain decoding.

Row fields (the shared schema): name ("autoregressive" or "speculative"), B (prompts in the
batch), H (target query heads), N (tree size bs; 1 for the baseline), d (head dim), median_ms (the
median over REPEATS runs of one whole generation, after a warm-up run that compiles the kernels),
max_abs_err (greedy rows: the fraction of generated tokens that differ from plain greedy decoding
with the same target, 0.0 when exact; in float16 a near-tie between two logits can break
differently in the tree kernel and the plain one, and the outputs then diverge; sampling rows: 0.0,
nothing to compare token by token), and extra keys: figure, mode, width, tree_size, tokens_per_s,
accepted_per_call, tokens_per_call, target_calls, draft_calls, new_tokens, identical (greedy: the
whole output equals the baseline's), draft (the draft's label), speedup (tokens/s over the
baseline's).
"""

from __future__ import annotations

import json

import torch

from course.core import impl as course_impl
from course.core import runtime

SUITE = "capstone"
PAIR = "small"
BATCH = 4
MAX_NEW = 128
PROMPT_CHARS = 48
TREE_SIZES = (2, 4, 8, 16, 32)
WIDTHS = (1, 2, 4, 8)
DEFAULT_TREE, DEFAULT_WIDTH = 8, 2
REPEATS = 3
PROMPT_SEED = 7  # held-out text: training used seed 1, the held-out loss seed 2


def prompts(batch: int = BATCH, chars: int = PROMPT_CHARS, seed: int = PROMPT_SEED) -> list[str]:
    """`batch` prompts of `chars` characters: the starts of lines of freshly generated text."""
    from .text import corpus

    lines = [line for line in corpus(200 * batch * chars, seed).split("\n") if len(line) >= chars]
    if len(lines) < batch:
        raise ValueError(f"could not find {batch} lines of {chars} characters")
    return [line[:chars] for line in lines[:batch]]


def compare(target, draft, texts: list[str], max_new_tokens: int, *, tree_size: int = DEFAULT_TREE,
            width: int = DEFAULT_WIDTH, mode: str = "greedy", seed: int = 0, backend: str = "kernels",
            impl: str | None = None, progress: bool = False) -> dict:
    """Speculative and plain decoding of the same prompts with the same target. Returns
    {"speculative": Generation, "autoregressive": Generation, "texts": the speculative continuations,
    "same": whether the two outputs agree token for token (expected in greedy mode)}. On a GPU a
    warm-up of both, as long as the timed runs, runs first (Triton compiles on first use)."""
    from . import decoder
    from .text import decode, encode

    encoded = [encode(t) for t in texts]
    options = dict(mode=mode, seed=seed, backend=backend, impl=impl)
    if runtime.on_gpu():
        # As long as the timed run: Triton compiles a kernel again for each new block shape, and
        # the tree's and the prefix's sizes reach new ones along the way (a 4-token warm-up left a
        # second of compiling in the timed run).
        decoder.speculative(target, draft, encoded, max_new_tokens, tree_size=tree_size, width=width,
                            **options)
        decoder.autoregressive(target, encoded, max_new_tokens, **options)
    spec = decoder.speculative(target, draft, encoded, max_new_tokens, tree_size=tree_size, width=width,
                               progress=progress, **options)
    plain = decoder.autoregressive(target, encoded, max_new_tokens, progress=progress, **options)
    return {"speculative": spec, "autoregressive": plain, "texts": [decode(t) for t in spec.tokens],
            "same": spec.tokens == plain.tokens}


def generate_report(texts, *, pair: str | None = None, max_new_tokens: int | None = None, tree_size: int = 8,
                    width: int = 2, mode: str = "greedy", seed: int = 0, backend: str = "kernels",
                    impl: str | None = None, progress: bool = True) -> str:
    """What `python -m course generate` prints: each prompt and its continuation, then tokens/s of
    speculative and plain decoding and the draft tokens accepted per target call. Pair "small" (fp16)
    on a GPU, "tiny" (fp32) in the simulator by default."""
    from . import weights

    texts = [texts] if isinstance(texts, str) else list(texts)
    pair = pair or runtime.pick(sim="tiny", gpu="small")
    max_new_tokens = max_new_tokens if max_new_tokens is not None else runtime.pick(sim=12, gpu=64)
    dtype = torch.float16 if runtime.on_gpu() else torch.float32
    try:
        loaded = weights.load_pair(pair, dtype=dtype)
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None
    from .decoder import check_texts, settings

    check_texts(texts)  # clear errors before anything runs
    settings(tree_size, width, mode=mode)
    from course.exercise import ExerciseNotImplemented

    try:
        out = compare(loaded.target, loaded.draft, texts, max_new_tokens, tree_size=tree_size, width=width,
                      mode=mode, seed=seed, backend=backend, impl=impl, progress=progress)
    except ExerciseNotImplemented as error:
        raise ValueError(f"{error}\nThe kernels backend runs your lessons/ copy of notebooks 16-18's "
                         "kernels: write them, or pass --impl solutions (the reference copy) or "
                         "--backend reference (torch)") from None
    spec, plain = out["speculative"], out["autoregressive"]
    lines = [f"pair {pair} ({runtime.MODE}, {str(dtype).replace('torch.', '')}, {backend}), mode {mode}, "
             f"tree size {tree_size}, width {width}"]
    for text, more in zip(texts, out["texts"], strict=True):
        lines.append(f"{text!r} -> {more!r}")
    lines.append(f"speculative:    {spec.tokens_per_s:8.1f} tokens/s, {spec.accepted_per_call:.2f} draft "
                 f"tokens accepted per target call ({spec.tokens_per_call:.2f} tokens per call, "
                 f"{spec.target_calls} target calls)")
    lines.append(f"autoregressive: {plain.tokens_per_s:8.1f} tokens/s ({plain.target_calls} target calls)")
    lines.append(f"speedup {spec.tokens_per_s / plain.tokens_per_s:.2f}x"
                 + (f"; greedy outputs identical: {out['same']}" if mode == "greedy" else ""))
    return "\n".join(lines)


def _mismatch(got: list[list[int]], want: list[list[int]]) -> float:
    total = sum(len(w) for w in want)
    wrong = sum(sum(a != b for a, b in zip(g, w, strict=False)) + abs(len(g) - len(w))
                for g, w in zip(got, want, strict=True))
    return wrong / max(total, 1)


def _timed(run, repeats: int):
    """(the median run, its time in ms): every figure of a row (tokens/s, speed-ups) comes from one run,
    the median one (the lower middle one for an even count)."""
    runs = sorted((run() for _ in range(repeats)), key=lambda r: r.seconds)
    middle = runs[(len(runs) - 1) // 2]
    return middle, 1e3 * middle.seconds


def measure(pair=None, batch: int = BATCH, max_new: int = MAX_NEW, tree_sizes=TREE_SIZES, widths=WIDTHS,
            repeats: int = REPEATS, figures=("speed", "drafts", "sample")) -> list[dict]:
    """The rows of every figure (see the module docstring). GPU only."""
    from . import decoder, weights
    from .text import encode

    pair = pair or weights.load_pair(PAIR, dtype=torch.float16)
    target, draft = pair.target, pair.draft
    encoded = [encode(t) for t in prompts(batch)]
    base = dict(B=batch, H=target.config.n_heads, d=target.config.head_dim, pair=pair.name)
    kw = dict(backend="kernels", impl=course_impl.bench_impl())  # solutions/, or a hand-out's lessons/
    decoder.autoregressive(target, encoded, 4, **kw)  # warm-up: compiles the kernels
    decoder.speculative(target, draft, encoded, 4, **kw)
    rows = []

    def row(figure, gen, median_ms, err, **extra):
        return dict(base, figure=figure, name=gen.method, mode=gen.mode, median_ms=median_ms,
                    max_abs_err=err, tokens_per_s=gen.tokens_per_s, accepted_per_call=gen.accepted_per_call,
                    tokens_per_call=gen.tokens_per_call, target_calls=gen.target_calls,
                    draft_calls=gen.draft_calls, new_tokens=gen.new_tokens, **extra)

    plain, plain_ms = _timed(lambda: decoder.autoregressive(target, encoded, max_new, **kw), repeats)
    want = plain.tokens
    if "speed" in figures:
        rows.append(row("speed", plain, plain_ms, 0.0, N=1, tree_size=1, width=0, speedup=1.0))
        for bs in tree_sizes:
            for w in widths:
                if w > bs:
                    continue
                gen, ms = _timed(lambda bs=bs, w=w: decoder.speculative(
                    target, draft, encoded, max_new, tree_size=bs, width=w, **kw), repeats)
                rows.append(row("speed", gen, ms, _mismatch(gen.tokens, want), N=bs, tree_size=bs, width=w,
                                speedup=gen.tokens_per_s / plain.tokens_per_s, identical=gen.tokens == want))
                print(json.dumps({k: rows[-1][k] for k in ("tree_size", "width", "tokens_per_s",
                                                           "accepted_per_call", "speedup", "max_abs_err")}),
                      flush=True)
    if "drafts" in figures:
        for label, snapshot in weights.load_drafts(pair.name, dtype=torch.float16):
            gen, ms = _timed(lambda s=snapshot: decoder.speculative(
                target, s, encoded, max_new, tree_size=DEFAULT_TREE, width=DEFAULT_WIDTH, **kw), repeats)
            rows.append(row("drafts", gen, ms, _mismatch(gen.tokens, want), N=DEFAULT_TREE,
                            tree_size=DEFAULT_TREE, width=DEFAULT_WIDTH, draft=label,
                            speedup=gen.tokens_per_s / plain.tokens_per_s, identical=gen.tokens == want))
            print(json.dumps({k: rows[-1][k] for k in ("draft", "accepted_per_call", "speedup")}), flush=True)
    if "sample" in figures:
        sp, sp_ms = _timed(lambda: decoder.autoregressive(target, encoded, max_new, mode="sample", **kw),
                           repeats)
        rows.append(row("sample", sp, sp_ms, 0.0, N=1, tree_size=1, width=0, speedup=1.0))
        gen, ms = _timed(lambda: decoder.speculative(target, draft, encoded, max_new, mode="sample",
                                                     tree_size=DEFAULT_TREE, width=DEFAULT_WIDTH, **kw),
                         repeats)
        rows.append(row("sample", gen, ms, 0.0, N=DEFAULT_TREE, tree_size=DEFAULT_TREE,
                        width=DEFAULT_WIDTH, speedup=gen.tokens_per_s / sp.tokens_per_s))
    return rows


SECTIONS = {"decode": measure}


def section_of(row: dict) -> str:
    """Every row of capstone.json comes from the one section."""
    return "decode"
