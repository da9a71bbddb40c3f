"""The capstone's measurements: `python -m course.capstone.bench` on a GPU writes
results/<device>/capstone.json and the figure capstone.png next to it.

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

import argparse
import json

import torch

from course.core import impl as course_impl
from course.core import runtime
from course.measure import results

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


def plot(rows: list[dict], note: str | None = None):
    """Three panels from the rows of capstone.json: speedup against tree size (one line per width),
    draft tokens accepted per target call against draft quality, and tokens/s of each method."""
    import matplotlib.pyplot as plt

    speed = [r for r in rows if r.get("figure") == "speed" and r.get("median_ms") is not None]
    drafts = [r for r in rows if r.get("figure") == "drafts" and r.get("median_ms") is not None]
    if not speed:
        raise ValueError("no 'speed' rows to plot")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for w in sorted({r["width"] for r in speed if r["name"] == "speculative"}):
        line = sorted((r["tree_size"], r["speedup"]) for r in speed if r["name"] == "speculative"
                      and r["width"] == w)
        ax.plot([x for x, _ in line], [y for _, y in line], "o-", label=f"w = {w}")
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree size bs (nodes verified per target call)")
    ax.set_ylabel("speedup over autoregressive (tokens/s)")
    ax.set_title("speedup vs tree size and width")
    ax.legend(fontsize=8)
    ax = axes[1]
    if drafts:
        ax.plot(range(len(drafts)), [r["accepted_per_call"] for r in drafts], "o-", label="accepted / call")
        ax.set_xticks(range(len(drafts)), [r["draft"] for r in drafts], rotation=30, ha="right", fontsize=8)
        twin = ax.twinx()
        twin.plot(range(len(drafts)), [r["speedup"] for r in drafts], "s--", color="C1", label="speedup")
        twin.set_ylabel("speedup", color="C1")
    ax.set_ylabel("draft tokens accepted per target call")
    ax.set_xlabel("draft (training steps)")
    ax.set_title(f"acceptance vs draft quality (bs = {DEFAULT_TREE}, w = {DEFAULT_WIDTH})")
    ax = axes[2]
    plain = next(r for r in speed if r["name"] == "autoregressive")
    best = max((r for r in speed if r["name"] == "speculative"), key=lambda r: r["tokens_per_s"])
    default = next((r for r in speed if r["name"] == "speculative" and r["tree_size"] == DEFAULT_TREE
                    and r["width"] == DEFAULT_WIDTH), best)
    bars = [("autoregressive", plain), (f"spec bs={default['tree_size']} w={default['width']}", default),
            (f"best: bs={best['tree_size']} w={best['width']}", best)]
    ax.bar(range(len(bars)), [r["tokens_per_s"] for _, r in bars], color=["gray", "C0", "C2"])
    ax.set_xticks(range(len(bars)), [n for n, _ in bars], fontsize=8)
    ax.set_ylabel("tokens / s (batch total)")
    ax.set_title("greedy decoding, same target")
    if note:
        fig.suptitle(note, fontsize=9)
    fig.tight_layout()
    return fig


LOOP_STEPS = (
    ("prefill", "emssd.unpadded_attention\n(notebook 17)", "prompts concatenated,\nper-sample KV starts"),
    ("draft: grow the tree", "swiftspec.tree_cache_attention\n(notebook 18)",
     "w best leaves per step,\npriority queue (SwiftSpec §3.1)"),
    ("verify: one target pass", "swiftspec.tree_cache_attention\n(notebook 18)",
     "bs most probable nodes\nas queries"),
    ("accept", "tree_verification\n(notebook 16)", "greedy walk or SpecInfer's\nspeculative sampling"),
    ("re-root + compact", "swiftspec.compact\n(notebook 18)", "path -> prefix, surviving\nsubtree reused"),
)


def loop_figure():
    """The decoder's loop as a diagram: each stage, the kernel that runs it and what it does."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig, ax = plt.subplots(figsize=(14, 3.4))
    xs = [0.1 + 0.2 * i for i in range(len(LOOP_STEPS))]
    for i, ((title, kernel, what), x) in enumerate(zip(LOOP_STEPS, xs, strict=True)):
        color = "#eeeeee" if i == 0 else "#dbe9f6"
        ax.add_patch(FancyBboxPatch((x - 0.085, 0.3), 0.17, 0.5, boxstyle="round,pad=0.01", fc=color,
                                    ec="#444444", transform=ax.transAxes))
        ax.text(x, 0.72, title, ha="center", va="center", fontsize=10, fontweight="bold",
                transform=ax.transAxes)
        ax.text(x, 0.56, kernel, ha="center", va="center", fontsize=8.5, family="monospace",
                transform=ax.transAxes)
        ax.text(x, 0.39, what, ha="center", va="center", fontsize=8, color="#333333", transform=ax.transAxes)
        if i:
            ax.add_patch(FancyArrowPatch((xs[i - 1] + 0.087, 0.55), (x - 0.087, 0.55), arrowstyle="-|>",
                                         mutation_scale=14, transform=ax.transAxes, color="#444444"))
    ax.add_patch(FancyArrowPatch((xs[-1], 0.3), (xs[1], 0.3), connectionstyle="arc3,rad=-0.25",
                                 arrowstyle="-|>", mutation_scale=14, transform=ax.transAxes,
                                 color="#c0504d"))
    ax.text(0.5 * (xs[1] + xs[-1]), 0.9, "next round: every unfinished sample, its own prefix and tree",
            ha="center", fontsize=9, color="#c0504d", transform=ax.transAxes)
    ax.set_axis_off()
    fig.tight_layout()
    return fig


def round_figure(entry: dict, ax=None, title: str | None = None):
    """One round of `decoder.speculative(..., trace=...)`: the draft tree, tokens as characters; the
    accepted path (green), the other nodes sent to the target (blue), draft-only nodes (grey)."""
    import matplotlib.pyplot as plt

    from course.measure.plots import tree_layout

    from .text import VOCAB

    parents, tokens = entry["parents"], entry["tokens"]
    pos = tree_layout(parents)
    path, chosen = set(entry["path"]), set(entry["chosen"])
    if ax is None:
        width = max(x for x, _ in pos.values()) + 1
        _, ax = plt.subplots(figsize=(min(14, 0.7 * width + 2), 3.6))
    for v, p in enumerate(parents):
        if p >= 0:
            lit = v in path and p in path
            ax.plot(*zip(pos[p], pos[v], strict=True), color="#2e7d32" if lit else "#999999",
                    lw=2.4 if lit else 1, zorder=1)
    for v, (x, y) in pos.items():
        face = "#81c784" if v in path else "#90caf9" if v in chosen else "#eeeeee"
        ax.scatter([x], [y], s=420, c=face, edgecolors="#333333", zorder=2)
        char = VOCAB[tokens[v]]
        ax.text(x, y, {"\n": "\\n", " ": "\u2423"}.get(char, char), ha="center", va="center", fontsize=10,
                zorder=3, family="monospace")
    ax.set_axis_off()
    nxt = VOCAB[entry["next_token"]]
    ax.set_title(title or f"round {entry['round']}: {len(parents)} draft nodes, {len(chosen)} verified, "
                 f"{len(path) - 1} accepted, next token {nxt!r}"
                 + (" (its subtree is reused)" if entry["reused"] else ""), fontsize=10)
    return ax


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--no-figures", action="store_true")
    args = parser.parse_args(argv)
    if runtime.SIMULATOR:
        raise SystemExit("course.capstone.bench measures a GPU; the simulator has no times to record")
    rows = measure(batch=args.batch, max_new=args.max_new_tokens, repeats=args.repeats)
    path = results.save(SUITE, rows)
    print("wrote", path)
    if not args.no_figures:
        measured = results.load(SUITE, path.parent.name)
        fig = plot(measured["rows"], note=f"{measured['device']}, {measured['date'][:10]}")
        fig.savefig(path.parent / "capstone.png", dpi=120, bbox_inches="tight")
        print("wrote", path.parent / "capstone.png")


if __name__ == "__main__":
    main()
