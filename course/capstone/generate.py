"""`python -m course generate`: plain, chain and tree speculative decoding of the same prompts with
the capstone's trained pair, side by side: each prompt's continuation, then each method's tokens/s,
its speed-up over plain decoding and the draft tokens accepted per target call (notebook 19).

The measurement behind the course's figures is the bench (`course.capstone.bench`, `python -m course
bench capstone`); this command is the quick look a student takes at their own kernels at work.
"""

from __future__ import annotations

import torch

from course.core import runtime

from .bench import PAIR  # on a GPU, the pair the capstone bench measures; the simulator runs "tiny"

DEFAULT_CHAIN = 5  # k drafted tokens of the chain


def tree_options(kind: str, loaded, mode: str, temperature: float, tree_size=None, width=None, branch=None,
                 steps=None) -> dict:
    """The tree decoder's settings for `--tree kind` (`shapes.settings_for`), checked; sequoia and
    dynamic sampling measure the pair's acceptance vector first (`shapes.acceptance`). For sequoia,
    tree_size is the budget and steps the depth limit."""
    from . import shapes
    from .decoder import settings

    if kind not in shapes.TREES:
        raise ValueError(f"tree must be one of {shapes.TREES}, got {kind!r}")
    if kind == "sequoia" and (width is not None or branch is not None):
        raise ValueError("width and branch are not settings of --tree sequoia: its dynamic program derives "
                         "them from the budget (--tree-size) and the depth limit (--steps)")
    needs_rates = kind == "sequoia" or (kind == "dynamic" and mode == "sample")
    rates = shapes.acceptance(loaded, mode, temperature) if needs_rates else None
    default = shapes.SMALL if loaded.name == "tiny" else shapes.FIXED
    if kind == "sequoia":
        tree = shapes.settings_for(kind, rates, mode, tree_size=tree_size, max_depth=steps, default=default)
        tree.pop("predicted_tokens_per_call")
    else:
        tree = shapes.settings_for(kind, rates, mode, tree_size=tree_size, width=width, branch=branch,
                                   steps=steps, default=default)
    settings(**tree, mode=mode, temperature=temperature)  # the decoder's own checks, before any build
    return tree


def generate_report(texts, *, pair: str | None = None, max_new_tokens: int | None = None,
                    tree: str = "sequoia", tree_size: int | None = None, width: int | None = None,
                    branch: int | None = None, steps: int | None = None, chain: int = DEFAULT_CHAIN,
                    mode: str = "greedy", temperature: float = 1.0, seed: int = 0, backend: str = "kernels",
                    impl: str | None = None, progress: bool = True) -> str:
    """What `python -m course generate` prints: each prompt and its continuation, then tokens/s of
    plain decoding, chain speculative decoding (`chain` drafted tokens) and tree speculative decoding
    (the shape `tree`, `course.capstone.shapes`) of the same prompts, their speed-ups and tokens per
    target call. Pair "medium" (fp16) on a GPU, "tiny" (fp32) in the simulator by default. On a GPU
    each decoder is built (graphs captured) and warmed up before the timed run."""
    from . import weights
    from .decoder import PlainDecoder, SpeculativeDecoder, check_temperature, check_texts, settings

    texts = [texts] if isinstance(texts, str) else list(texts)
    pair = pair or runtime.pick(sim="tiny", gpu=PAIR)
    max_new_tokens = max_new_tokens if max_new_tokens is not None else runtime.pick(sim=12, gpu=128)
    dtype = torch.float16 if runtime.on_gpu() else torch.float32
    encoded = check_texts(texts)  # clear errors before anything runs
    check_temperature(temperature, mode)
    settings(chain + 1, 1, 1, chain, mode)  # the chain's checks, before anything loads
    try:
        loaded = weights.load_pair(pair, dtype=dtype)
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None
    shape = tree_options(tree, loaded, mode, temperature, tree_size, width, branch, steps)
    from course.core.stubs import ExerciseNotImplemented

    options = dict(batch=len(encoded), max_len=max(len(p) for p in encoded) + max_new_tokens, mode=mode,
                   backend=backend, impl=impl, temperature=temperature)
    try:
        decoders = {"plain": PlainDecoder(loaded.target, **options)}
        decoders["chain"] = SpeculativeDecoder(loaded.target, loaded.draft, tree_size=chain + 1, width=1,
                                               branch=1, steps=chain, **options)
        decoders["tree"] = SpeculativeDecoder(loaded.target, loaded.draft, **shape, **options)
        runs = {}
        for label, built in decoders.items():
            if runtime.on_gpu():
                built.generate(encoded, max_new_tokens, seed=seed)  # warm-up
            runs[label] = built.generate(encoded, max_new_tokens, seed=seed, progress=progress)
    except ExerciseNotImplemented as error:
        raise ValueError(f"{error}\nThe kernels backend runs your lessons/ copy of notebooks 16-18's "
                         "kernels: write them, or pass --impl solutions (the reference copy) or "
                         "--backend reference (torch)") from None
    from .text import decode

    graphs = decoders["plain"].graphs
    lines = [f"pair {pair} ({runtime.MODE}, {str(dtype).replace('torch.', '')}, {backend}"
             f"{', CUDA graphs' if graphs else ''}), mode {mode}"
             + (f" at temperature {temperature:g}" if mode == "sample" else "")]
    for text, more in zip(texts, runs["tree"].tokens, strict=True):
        lines.append(f"{text!r} -> {decode(more)!r}")
    plain = runs["plain"]
    labels = {"plain": "plain decoding", "chain": f"chain (k = {chain})",
              "tree": f"{tree} tree (bs {shape['tree_size']}, w {shape['width']}, branch {shape['branch']}, "
                      f"{shape['steps']} steps)"}
    for label, run in runs.items():
        line = f"{labels[label]:52s} {run.tokens_per_s:9.1f} tokens/s"
        if label != "plain":
            line += (f"  {run.tokens_per_s / plain.tokens_per_s:5.2f}x plain, "
                     f"{run.accepted_per_call:.2f} draft tokens accepted per target call "
                     f"({run.tokens_per_call:.2f} tokens per call)")
        lines.append(line)
    if mode == "greedy":
        same = all(run.tokens == plain.tokens for run in runs.values())
        lines.append(f"greedy outputs identical: {same}")
    if not runtime.on_gpu():
        lines.append("(simulator: these speeds are the CPU's, not a GPU's; see results/h100/capstone.json)")
    return "\n".join(lines)
