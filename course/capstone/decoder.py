"""The capstone: a tree speculative decoder built from the course's kernels (notebook 19).

SpecInfer (Miao et al., 2024) verifies a whole token TREE of draft guesses with one target pass;
SwiftSpec grows that tree by maximum likelihood (§3.1) and keeps the KV caches as [prefix | tree]
(§3.2), so that the accepted path's KV joins the prefix by a few row moves. A batch of prompts is
served at once: every sample keeps its own prefix length and accepts its own number of tokens.

Why rounds must be cheap (SwiftSpec §3.3). A round emits tau tokens per sample for one target pass,
s draft passes and some bookkeeping, so the speed-up over plain decoding is

    speed-up = tau * T_plain / (s * T_draft + T_verify + T_rest),

and every microsecond the host spends launching kernels or waiting is in the denominator. With
models this small a step is a few hundred tiny kernels whose launches cost more than their work, so
this decoder does what SwiftSpec's latency-optimised system does: every step has static shapes and
preallocated buffers (caches, trees, positions, intervals, all sized when the decoder is built), no
step waits for the host, and on a GPU each is captured once as a CUDA graph and replayed (one
launch for all its kernels). The host waits once per round, for the accepted tokens. Plain
decoding runs on the same machinery, so speculation is measured against a fast baseline.

One round, for every unfinished sample b with committed prefix P_b (the sequence without its last
token) and root = its last token (`course.capstone.tree` says how the tree's shape is fixed):

1. Draft, `steps` passes (`swiftspec.tree_cache_attention`, notebook 18): step 0 runs the root (and
   the last accepted token of the previous round if the draft had not run it: the tree's leaves are
   verified without being drafted); each later step runs the `width` most probable nodes not yet
   run as queries against [prefix | tree], each seeing its ancestors, and gives each `branch`
   children.
2. Verify: the `tree_size` most probable nodes (a subtree containing the root) go through the target
   in ONE pass (`tree_cache_attention`, rows P_b + j of its cache), then
   `tree_verification.greedy_tree_verification` (greedy) or `tree_speculative_sampling` (sampling,
   notebook 16) returns the accepted path and one more token.
3. Commit (`swiftspec.compact`): in both caches the accepted path's KV rows move to the end of the
   prefix; the emitted token becomes the next root. Everything else is dropped by moving nothing.

Chain speculative decoding (Leviathan et al., 2023) is the case width = branch = 1, tree_size =
steps + 1: one drafted path.

Prefill uses `emssd.unpadded_attention` (notebook 17): the prompts, of different lengths, without
padding. Plain decoding is the same tree attention with a one-node tree (a query that sees the prefix
and itself), so both methods run the same attention kernel.

Exactness. Greedy mode emits exactly the target's greedy continuation: verification accepts a
token only if it is the target's argmax, and always adds the target's argmax at the last accepted
node (up to float rounding: a verification pass of many queries and a plain step of one sum in
different orders, so a near-tie between two logits may break differently). Sampling mode's tokens
follow the target's distribution exactly (SpecInfer §4.3): see `course.capstone.tree`. Random
numbers are explicit: a torch.Generator seeded with `seed` draws every uniform of a generation on
the host before it starts, so kernels and reference, eager and graphed, see the same numbers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from course.core import runtime

from .backends import BACKENDS, TreeIndex, inverse_cdf, make_backend
from .bookkeeping import FusedBookkeeping, Moves, Progress, RoundState, TorchBookkeeping, reset_trees
from .tree import KEYS, MODES, DraftTrees, check_bias, schedule

CHECK_EVERY = 8  # plain decoding with an end token: steps between two looks at the finished flags

# --------------------------------------------------------------------------- which implementation runs
# The one place where a decoder's classes are chosen, once, when it is built (`implementations`):
#
#   backend="kernels"     backends.KernelBackend: the course's kernels (lessons/, or solutions/ with impl=)
#   backend="reference"   backends.ReferenceBackend: torch with dense masks, the statement to compare with
#   bookkeeping="fused"   bookkeeping.FusedBookkeeping: one Triton kernel per phase (the kernels' default)
#   bookkeeping="torch"   bookkeeping.TorchBookkeeping: the same in torch operations (the reference's default)
#
# (`backends.make_backend` maps a backend's name to its class; the parallel draft's sides use it too.)
BOOKKEEPING = {"fused": FusedBookkeeping, "torch": TorchBookkeeping}
DEFAULT_BOOKKEEPING = {"kernels": "fused", "reference": "torch"}


def implementations(backend: str, bookkeeping: str | None, impl: str | None):
    """(the backend's operations, the bookkeeping) that a decoder of these settings runs (the table
    above); errors name the setting."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    name = bookkeeping or DEFAULT_BOOKKEEPING[backend]
    if not isinstance(name, str) or name not in BOOKKEEPING:
        raise ValueError(f"bookkeeping must be one of {tuple(BOOKKEEPING)}, got {name!r}")
    return make_backend(backend, impl), BOOKKEEPING[name]()


@dataclass
class Generation:
    """What a decoding run produced and what it cost."""

    tokens: list[list[int]]  # the new tokens of each prompt (the prompt itself not repeated)
    seconds: float  # decoding time (after prefill), synchronized
    prefill_seconds: float
    target_calls: int  # target passes over the batch (verification rounds, or decode steps)
    draft_calls: int  # draft passes over the batch
    accepted: list[list[int]] = field(default_factory=list)  # per sample: draft tokens accepted per round
    mode: str = "greedy"
    method: str = "speculative"

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def accepted_per_call(self) -> float:
        """Mean draft tokens accepted per (sample, target call): 0 for plain decoding."""
        rounds = [a for per in self.accepted for a in per]
        return sum(rounds) / len(rounds) if rounds else 0.0

    @property
    def tokens_per_call(self) -> float:
        """Mean tokens emitted per (sample, target call): accepted + 1 (before truncation)."""
        rounds = [a for per in self.accepted for a in per]
        return (sum(rounds) + len(rounds)) / len(rounds) if rounds else 1.0

    def summary(self) -> str:
        line = (f"{self.method} ({self.mode}): {self.new_tokens} tokens in {self.seconds:.3f} s = "
                f"{self.tokens_per_s:.1f} tokens/s, {self.target_calls} target calls")
        if self.method == "speculative":
            line += (f", {self.accepted_per_call:.2f} draft tokens accepted per target call "
                     f"({self.tokens_per_call:.2f} tokens per call), {self.draft_calls} draft calls")
        return line


# --------------------------------------------------------------------------- input checks


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_prompts(prompts, vocab_size: int) -> list[list[int]]:
    """A non-empty list of non-empty token-id lists (or 1-D int tensors), ids in [0, vocab_size)."""
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist() if prompts.dim() == 2 else [prompts.tolist()]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists (one per sample)")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        prompts = [list(prompts)]  # one prompt given as a flat list
    out = []
    for b, prompt in enumerate(prompts):
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist()
        if isinstance(prompt, str) or not isinstance(prompt, (list, tuple)):
            raise ValueError(f"prompts[{b}] must be a list of token ids, got {type(prompt).__name__} "
                             "(encode text with course.capstone.text.encode)")
        if not prompt:
            raise ValueError(f"prompts[{b}] is empty: a prompt needs at least one token to continue")
        for i, t in enumerate(prompt):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
                raise ValueError(f"prompts[{b}][{i}] = {t!r} is not a token id in [0, {vocab_size})")
        out.append(list(prompt))
    return out


def _check_model(model, name: str):
    if not hasattr(model, "step") or not hasattr(model, "config"):
        raise ValueError(f"{name} must be a course.capstone.model.TinyLM, got {type(model).__name__}")


def _check_pair(target, draft):
    _check_model(target, "target")
    _check_model(draft, "draft")
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(f"draft must share the target's vocabulary: the target has "
                         f"{target.config.vocab_size} tokens, the draft {draft.config.vocab_size}")
    if target.device != draft.device:
        raise ValueError(f"draft must be on the target's device {target.device}, got {draft.device}")
    if target.dtype != draft.dtype:
        raise ValueError(f"draft must have the target's dtype {target.dtype}, got {draft.dtype}")


def _check_graphs(graphs, backend: str, device) -> bool:
    """CUDA graphs where they can be had (kernels on a GPU), unless told otherwise."""
    if graphs is None:
        return runtime.on_gpu() and backend == "kernels" and torch.device(device).type == "cuda"
    if not isinstance(graphs, bool):
        raise ValueError(f"graphs must be True, False or None (automatic), got {graphs!r}")
    if graphs and (runtime.SIMULATOR or torch.device(device).type != "cuda"):
        raise ValueError("graphs=True needs CUDA models on a GPU (the simulator has no CUDA graphs); "
                         "pass graphs=False or None")
    return graphs


def _no_clock(phase: str) -> None:
    """The loop's clock when nobody times the phases."""


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="tok", disable=not enabled, leave=False)


@dataclass(frozen=True)
class Settings:
    """The speculative decoder's knobs, checked: nodes verified per round (tree_size), nodes run per
    draft step (width), children per run node (branch), draft steps per round (steps), the key rule
    and the (steps, branch) log acceptance rates added along each path (`course.capstone.tree`),
    siblings drawn with or without replacement, and the sampling temperature."""

    tree_size: int
    width: int
    branch: int
    steps: int
    mode: str
    key: str | None = None
    bias: tuple[tuple[float, ...], ...] | None = None
    replacement: bool = False
    temperature: float = 1.0

    @property
    def plan(self):
        return schedule(self.steps, self.width, self.branch)

    @property
    def is_chain(self) -> bool:
        return self.width == 1 and self.branch == 1


def check_temperature(temperature, mode: str) -> float:
    """A finite temperature > 0 (sample mode divides the logits by it); greedy takes only 1.0."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if mode == "greedy" and temperature != 1.0:
        raise ValueError(f"temperature = {temperature!r} means nothing in greedy mode (the argmax does not "
                         "change); use mode='sample'")
    return float(temperature)


def settings(tree_size=8, width=2, branch=None, steps=None, mode="greedy", *, key=None, bias=None,
             replacement=False, temperature=1.0) -> Settings:
    """Defaults: branch 4, and steps = ceil((tree_size - 1) / width), about the depth a best-first
    tree of tree_size nodes reaches when each step adds width nodes (tree_size - 1 for a chain)."""
    tree_size = _positive_int(tree_size, "tree_size")
    width = _positive_int(width, "width")
    if width > tree_size:
        raise ValueError(f"width = {width} must be <= tree_size = {tree_size}: the draft expands at most "
                         "as many nodes per step as the tree it sends for verification holds")
    branch = 4 if branch is None else _positive_int(branch, "branch")
    steps = max(1, math.ceil((tree_size - 1) / width)) if steps is None else _positive_int(steps, "steps")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if key is not None and key not in KEYS:
        raise ValueError(f"key must be one of {KEYS}, got {key!r}")
    if not isinstance(replacement, bool):
        raise ValueError(f"replacement must be True or False, got {replacement!r}")
    temperature = check_temperature(temperature, mode)
    plan = schedule(steps, width, branch)
    if tree_size > plan.size:
        raise ValueError(f"tree_size = {tree_size} is more than the {plan.size} nodes that {steps} draft "
                         f"steps of width {width} with branch {branch} grow: raise steps, width or branch")
    if bias is not None:
        bias = tuple(tuple(row) for row in check_bias(bias, steps, branch).tolist())
    return Settings(tree_size, width, branch, steps, mode, key, bias, replacement, temperature)


def prefill(ops, model, cache, prompts: list[list[int]]) -> None:
    """Every prompt but its last token into rows [0, len - 1) of the cache, EMS-SD style (counts =
    prompt lengths - 1), with backend `ops`: what every decoder does first (notebook 20's workers too)."""
    counts = [len(p) - 1 for p in prompts]
    width = max(counts)
    if width == 0:
        return
    tokens = torch.zeros((len(prompts), width), dtype=torch.long)
    rows = torch.full((len(prompts), width), -1, dtype=torch.long)
    for b, p in enumerate(prompts):
        tokens[b, :counts[b]] = torch.tensor(p[:-1])
        rows[b, :counts[b]] = torch.arange(counts[b])
    positions = rows.clamp(min=0)
    device = model.device
    model.step(tokens.to(device), positions.to(device), cache, rows.to(device),
               ops.causal(counts, [0] * len(prompts)))


# --------------------------------------------------------------------------- the decoders


@dataclass(frozen=True)
class StepInputs:
    """The static inputs of one model step: (B, W) tokens, positions and cache rows, and the (B, R)
    tree ids of the nodes it runs (draft steps)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    rows: torch.Tensor
    ids: torch.Tensor

    @classmethod
    def zeros(cls, batch: int, width: int, runs: int, device) -> StepInputs:
        long = dict(dtype=torch.int64, device=device)
        return cls(torch.zeros((batch, width), **long), torch.zeros((batch, width), **long),
                   torch.zeros((batch, width), **long), torch.zeros((batch, runs), **long))


class Decoder:
    """What plain and speculative decoding share: the target, its cache, the per-sample state on the
    device, the prefill, the output buffer, and the loop that runs and times a generation.

    A decoder is built for a batch size and a longest sequence (`max_len`: prompt plus new tokens);
    every buffer is allocated then, and on a GPU every step is captured as a CUDA graph then (the
    first build of a shape also compiles the Triton kernels). `generate` can then be called any
    number of times with prompts that fit. backend and bookkeeping choose the classes that run
    (`implementations`). The bookkeeping reads and writes the decoder's buffers through `self.state`
    (a `bookkeeping.Progress`, or a `RoundState` for speculative decoding): the same tensors, named
    once, built after every buffer and before any graph is captured.
    """

    method = ""

    def __init__(self, target, *, batch: int, max_len: int, mode: str = "greedy", backend: str = "kernels",
                 impl: str | None = None, graphs: bool | None = None, bookkeeping: str | None = None,
                 extra_rows: int = 0, temperature: float = 1.0):
        _check_model(target, "target")
        self.batch = _positive_int(batch, "batch")
        self.max_len = _positive_int(max_len, "max_len")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.ops, self.book = implementations(backend, bookkeeping, impl)
        self.target, self.mode, self.backend = target, mode, backend
        self.temperature = check_temperature(temperature, mode)
        self.capacity = max_len + extra_rows
        if self.capacity > target.config.max_positions:
            raise ValueError(f"max_len = {max_len}: with the rows a round may add ({extra_rows}) a sequence "
                             f"reaches position {self.capacity}, more than the target's max_positions = "
                             f"{target.config.max_positions}")
        self.graphs = _check_graphs(graphs, backend, target.device)
        device = self.device = target.device
        B = batch
        self.t_cache = target.new_cache(B, self.capacity)
        long = dict(dtype=torch.int64, device=device)
        self.prefix = torch.zeros(B, **long)  # committed tokens whose KV is cached
        self.prefix32 = torch.zeros(B, dtype=torch.int32, device=device)  # the same, for the kernels
        self.root = torch.zeros(B, **long)  # the last committed token (not yet cached)
        self.n_out = torch.zeros(B, **long)
        self.done = torch.ones(B, dtype=torch.bool, device=device)  # until a generation starts
        self.limit = torch.zeros(1, **long)  # max_new_tokens of the running generation
        self.eos = torch.full((1,), -1, **long)
        self.out = torch.zeros((B, self.capacity + 1), **long)  # the last column is scratch
        self.counter = torch.zeros(1, **long)  # rounds (or steps) so far: the row of the uniforms
        self.status = torch.zeros((3, B), **long)  # done, accepted this round (-1: inactive), n_out
        self.uniforms = None  # (rounds, B, per round) float64 in sample mode, drawn per generation

    def _progress(self) -> Progress:
        """The per-sample buffers above, for the bookkeeping (after `uniforms` is allocated)."""
        return Progress(self.prefix, self.prefix32, self.root, self.n_out, self.done, self.limit, self.eos,
                        self.out, self.counter, self.status, self.uniforms)

    # ------------------------------------------------------------------ building blocks

    def _index(self, width: int, cache, tree_len: int = 1) -> TreeIndex:
        """Index buffers for a tree-attention step of `width` queries over `cache`, holding a valid
        one-node tree for the launchers' checks (the steps overwrite what they use)."""
        int32 = dict(dtype=torch.int32, device=self.device)
        rows = cache.capacity + 1
        return TreeIndex(torch.zeros((self.batch, width), **int32), torch.zeros((self.batch, width), **int32),
                         torch.zeros((self.batch, rows), **int32), torch.zeros((self.batch, rows), **int32),
                         self.prefix32, torch.full((self.batch,), tree_len, **int32),
                         torch.full((self.batch,), width, **int32))

    def _phase(self, fn):
        """fn as it runs in the loop: captured in a CUDA graph on a GPU (course.measure.timing.graphed
        warms it up, which compiles the kernels, then captures it), else fn itself."""
        if not self.graphs:
            return fn
        from course.measure.timing import graphed

        return graphed(fn)

    def _uniform_slice(self, first: int, count: int):
        """This round's uniforms [first, first + count), (B, count) float64 (sample mode)."""
        return self.uniforms.index_select(0, self.counter)[0, :, first:first + count]

    def built_for(self) -> dict:
        """The settings this decoder's buffers and graphs were built for."""
        return {"mode": self.mode, "temperature": self.temperature}

    def _scaled(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits at the sampling temperature (p = softmax(logits / T)); greedy: as they are."""
        return logits if self.temperature == 1.0 else logits / self.temperature

    def check_settings(self, **wanted) -> None:
        """A clear error, before anything runs, if a call asks for settings other than those this
        decoder's buffers and graphs were built for (None: no wish)."""
        built = self.built_for()
        for name, value in wanted.items():
            if name not in built:
                raise ValueError(f"{name} is not a setting of a {type(self).__name__}: it has "
                                 f"{', '.join(built)}")
            if value is not None and value != built[name]:
                raise ValueError(f"{name} = {value!r}: this decoder's buffers and graphs were built for "
                                 f"{name} = {built[name]!r}; build a {type(self).__name__} for the new value")

    # ------------------------------------------------------------------ one generation

    def _check_generate(self, prompts, max_new_tokens: int, eos) -> list[list[int]]:
        _positive_int(max_new_tokens, "max_new_tokens")
        prompts = check_prompts(prompts, self.target.config.vocab_size)
        if len(prompts) != self.batch:
            raise ValueError(f"prompts holds {len(prompts)} prompts; this decoder was built for batch = "
                             f"{self.batch}")
        longest = max(range(len(prompts)), key=lambda b: len(prompts[b]))
        if len(prompts[longest]) + max_new_tokens > self.max_len:
            raise ValueError(f"prompts[{longest}] has {len(prompts[longest])} tokens: with max_new_tokens = "
                             f"{max_new_tokens} that is {len(prompts[longest]) + max_new_tokens} cache rows, "
                             f"more than this decoder's max_len = {self.max_len}")
        if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int)
                                or not 0 <= eos < self.target.config.vocab_size):
            raise ValueError(f"eos must be a token id in [0, {self.target.config.vocab_size}) or None, "
                             f"got {eos!r}")
        return prompts

    def _prefill(self, model, cache, prompts: list[list[int]]) -> None:
        prefill(self.ops, model, cache, prompts)

    def start(self, prompts, max_new_tokens: int, eos=None, seed: int = 0) -> None:
        """The state of a new generation (after the prefill), and its uniforms (sample mode)."""
        self.prefix.copy_(torch.tensor([len(p) - 1 for p in prompts]))
        self.prefix32.copy_(self.prefix)
        self.root.copy_(torch.tensor([p[-1] for p in prompts]))
        self.n_out.zero_()
        self.done.zero_()
        self.limit.fill_(max_new_tokens)
        self.eos.fill_(-1 if eos is None else eos)
        self.counter.zero_()
        if self.mode == "sample":
            gen = torch.Generator().manual_seed(seed)
            self.uniforms.copy_(torch.rand(self.uniforms.shape, generator=gen, dtype=torch.float64))

    def generate(self, prompts, max_new_tokens: int, *, seed: int = 0, eos: int | None = None,
                 progress: bool = False, trace: list | None = None, clock=None, **settings) -> Generation:
        """Decode max_new_tokens per prompt (fewer after `eos`). prompts: token-id lists, exactly
        `batch` of them, each with len + max_new_tokens <= max_len. seed: of every uniform (sample
        mode). trace: a list to which every round appends what it did per sample (speculative).
        clock: called with a phase's name before the loop launches it ("draft", "verify", "commit",
        "wait" for the host's read; "step" for plain decoding) and with "end" at the end (the bench
        records CUDA events there). settings (mode=, and tree_size=, width=, branch=, steps= for a
        SpeculativeDecoder): must be those the decoder was built for."""
        self.check_settings(**settings)
        prompts = self._check_generate(prompts, max_new_tokens, eos)
        if trace is not None and not isinstance(trace, list):
            raise ValueError(f"trace must be a list or None, got {type(trace).__name__}")
        t0 = time.perf_counter()
        self._prefill_all(prompts)
        self.start(prompts, max_new_tokens, eos, seed)
        _sync(self.device)
        t1 = time.perf_counter()
        bar = _progress(self.batch * max_new_tokens, f"{self.method} ({self.mode})", progress)
        accepted: list[list[int]] = [[] for _ in prompts]
        calls = self._loop(max_new_tokens, eos, accepted, bar, trace, clock or _no_clock)
        _sync(self.device)
        t2 = time.perf_counter()
        bar.close()
        out, count = self.out.tolist(), self.n_out.tolist()
        tokens = []
        for b in range(len(prompts)):
            row = out[b][:min(count[b], max_new_tokens)]
            if eos is not None and eos in row:
                row = row[:row.index(eos) + 1]
            tokens.append(row)
        target_calls, draft_calls = calls
        return Generation(tokens, t2 - t1, t1 - t0, target_calls, draft_calls, accepted, self.mode,
                          self.method)

    def _prefill_all(self, prompts) -> None:
        self._prefill(self.target, self.t_cache, prompts)

    def _loop(self, max_new_tokens, eos, accepted, bar, trace, clock) -> tuple[int, int]:
        raise NotImplementedError


class PlainDecoder(Decoder):
    """Plain autoregressive decoding with the target alone: one token per sample per step, the tree
    attention kernel with a one-node tree (the query sees the prefix and itself). Greedy takes the
    argmax; sampling draws from the target's softmax by inverse CDF. On a GPU the step is one graph,
    and the host looks at the finished flags only every CHECK_EVERY steps (never without an end
    token): nothing in between waits for it."""

    method = "autoregressive"

    def __init__(self, target, *, batch: int, max_len: int, mode: str = "greedy", backend: str = "kernels",
                 impl: str | None = None, graphs: bool | None = None, bookkeeping: str | None = None,
                 temperature: float = 1.0):
        super().__init__(target, batch=batch, max_len=max_len, mode=mode, backend=backend, impl=impl,
                         graphs=graphs, bookkeeping=bookkeeping, temperature=temperature)
        if mode == "sample":
            self.uniforms = torch.zeros((max_len + 1, batch, 1), dtype=torch.float64, device=self.device)
        self.workspace = target.workspace(batch, 1)
        self.index = self._index(1, self.t_cache)
        self.attend = self.ops.tree_attention(target, self.t_cache, self.workspace, self.index)
        self.state = self._progress()
        self.step = self._phase(self._step)

    def _step(self) -> None:
        here = self.prefix[:, None]
        logits = self.target.step(self.root[:, None], here, self.t_cache, here, self.attend,
                                  workspace=self.workspace, validate=False, padding=False,
                                  float_logits=False)[:, 0]
        token = None
        if self.mode == "sample":
            probs = torch.softmax(self._scaled(logits), dim=-1, dtype=torch.float32)
            token = inverse_cdf(probs, self._uniform_slice(0, 1))[:, 0]
        self.book.advance(self.state, logits, token)

    def _loop(self, max_new_tokens, eos, accepted, bar, trace, clock) -> tuple[int, int]:
        steps = max_new_tokens
        for i in range(max_new_tokens):
            clock("step")
            self.step()
            if (eos is not None or not bar.disable) and (i + 1) % CHECK_EVERY == 0:
                bar.n = int(self.n_out.clamp(max=max_new_tokens).sum())
                bar.refresh()
                if eos is not None and bool(self.done.all()):
                    steps = i + 1
                    break
        clock("end")
        return steps, 0


class SpeculativeDecoder(Decoder):
    """Tree (or chain) speculative decoding of a batch (see the module docstring). The phases of a
    round are `draft_steps[s]` for s < steps, `verify` and `commit`, each a CUDA graph on a GPU."""

    method = "speculative"

    def __init__(self, target, draft, *, batch: int, max_len: int, tree_size: int = 8, width: int = 2,
                 branch: int | None = None, steps: int | None = None, mode: str = "greedy",
                 backend: str = "kernels", impl: str | None = None, graphs: bool | None = None,
                 bookkeeping: str | None = None, key: str | None = None, bias=None, replacement: bool = False,
                 temperature: float = 1.0):
        _check_pair(target, draft)
        self.settings = cfg = settings(tree_size, width, branch, steps, mode, key=key, bias=bias,
                                       replacement=replacement, temperature=temperature)
        self.plan = plan = cfg.plan
        # The last round may overshoot by tree_size tokens; the draft's tree sits after the prefix.
        extra = cfg.tree_size + plan.size
        if max_len + extra > draft.config.max_positions:
            raise ValueError(f"max_len = {max_len}: with the rows a round may add ({extra}) a sequence "
                             f"reaches position {max_len + extra}, more than the draft's max_positions = "
                             f"{draft.config.max_positions}")
        super().__init__(target, batch=batch, max_len=max_len, mode=mode, backend=backend, impl=impl,
                         graphs=graphs, bookkeeping=bookkeeping, extra_rows=extra, temperature=temperature)
        self.draft = draft
        B, bs, device = batch, cfg.tree_size, self.device
        self.d_cache = draft.new_cache(B, self.capacity)
        vocab = target.config.vocab_size
        self.tree = DraftTrees(B, plan, mode, vocab, device, key=cfg.key, bias=cfg.bias,
                               replacement=replacement)
        self.lag = torch.zeros(B, dtype=torch.bool, device=device)  # the draft has not run lag_token yet
        self.lag_token = torch.zeros(B, dtype=torch.int64, device=device)
        self.local = torch.zeros((B, plan.size), dtype=torch.int64, device=device)  # tree id -> verified slot
        self.slots = torch.arange(bs, device=device)
        if mode == "sample":
            draws = [r * self.tree.uniforms_per_run(vocab) for r in plan.runs]
            self._draw_at = [sum(draws[:s]) for s in range(plan.steps)]
            self._verify_at = sum(draws)
            self.uniforms = torch.zeros((max_len + 1, B, self._verify_at + 2 * bs), dtype=torch.float64,
                                        device=device)
        self._build_draft_steps()
        self._build_verification()
        self.state = self._round_state()
        self.draft_steps = [self._phase(lambda s=s: self._draft_step(s)) for s in range(plan.steps)]
        self.verify = self._phase(self._verify)
        self.commit = self._phase(self._commit)

    # ------------------------------------------------------------------ construction

    def _build_draft_steps(self) -> None:
        """Per step: its inputs, its index buffers (its tree length is fixed: the nodes made so far)
        and its attention, prepared on the workspace of its width. Step 0's query intervals are fixed
        too: slot 0 the lag token (interval -1: it sees no tree row, only the prefix, which it
        closes), slot 1 the root, whose interval is the whole tree's."""
        plan = self.plan
        self.d_kv_start = torch.zeros((self.batch, self.capacity + 1), dtype=torch.int32, device=self.device)
        self.d_kv_end = torch.zeros_like(self.d_kv_start)
        workspaces, self.step_inputs, self.d_index, self._d_attend, self._d_workspace = {}, [], [], [], []
        for step in range(plan.steps):
            width = 2 if step == 0 else plan.runs[step]
            if width not in workspaces:
                workspaces[width] = self.draft.workspace(self.batch, width)
            own = self._index(width, self.d_cache, tree_len=plan.before[step])
            index = TreeIndex(own.q_start, own.q_end, self.d_kv_start, self.d_kv_end, own.prefix,
                              own.tree_len, own.counts)
            self._d_attend.append(self.ops.tree_attention(self.draft, self.d_cache, workspaces[width], index))
            if step == 0:  # after the launchers' checks, which want the times of a real tree
                index.q_start[:, 0] = -1
                index.q_end[:, 0] = -1
                index.q_end[:, 1] = plan.spans[0] - 1
            self.d_index.append(index)
            self._d_workspace.append(workspaces[width])
            self.step_inputs.append(StepInputs.zeros(self.batch, width, plan.runs[step], self.device))

    def _build_verification(self) -> None:
        B, bs, V, device = self.batch, self.settings.tree_size, self.target.config.vocab_size, self.device
        self.t_workspace = self.target.workspace(B, bs)
        self.t_inputs = StepInputs.zeros(B, bs, bs, device)
        self.t_index = self._index(bs, self.t_cache, tree_len=bs)
        self.t_attend = self.ops.tree_attention(self.target, self.t_cache, self.t_workspace, self.t_index)
        int32 = dict(dtype=torch.int32, device=device)
        self.v_parents = torch.arange(-1, bs - 1, **int32).expand(B, bs).contiguous()  # a chain: valid
        self.v_tokens = torch.zeros((B, bs), **int32)
        self.chosen = torch.zeros((B, bs), dtype=torch.int64, device=device)
        if self.mode == "greedy":
            self.v_best = torch.zeros((B, bs), **int32)
            self.verifier = self.ops.greedy_verifier(self.v_parents, self.v_tokens, self.v_best)
        else:
            self.v_q = torch.full((B, bs, V), 1.0 / V, dtype=torch.float32, device=device)
            self.v_p = torch.full((B, bs, V), 1.0 / V, dtype=torch.float32, device=device)
            self.v_accept = torch.zeros((B, bs), dtype=torch.float64, device=device)
            self.v_sample = torch.zeros((B, bs), dtype=torch.float64, device=device)
            self.verifier = self.ops.sampling_verifier(self.v_parents, self.v_tokens, self.v_q, self.v_p,
                                                       self.v_accept, self.v_sample,
                                                       replacement=self.settings.replacement)
        self.path, self.next_token = self.verifier()  # its output buffers: the same on every call
        self.moves = {}
        for name, cache in (("target", self.t_cache), ("draft", self.d_cache)):
            src, dst = torch.zeros((B, bs), **int32), torch.zeros((B, bs), **int32)
            counts = torch.zeros(B, **int32)
            self.moves[name] = (src, dst, counts, self.ops.compactor(cache, src, dst, counts))

    def _round_state(self) -> RoundState:
        """The buffers of a round, for the bookkeeping (after every one of them is allocated)."""
        return RoundState(
            progress=self._progress(), tree=self.tree, plan=self.plan, tree_size=self.settings.tree_size,
            draft_inputs=self.step_inputs, draft_index=self.d_index, draft_kv_start=self.d_kv_start,
            draft_kv_end=self.d_kv_end, scratch_row=self.d_cache.scratch_row, lag=self.lag,
            lag_token=self.lag_token, local=self.local, slots=self.slots, chosen=self.chosen,
            target_inputs=self.t_inputs, target_index=self.t_index, verify_parents=self.v_parents,
            verify_tokens=self.v_tokens, path=self.path, next_token=self.next_token,
            moves={name: Moves(*buffers[:3]) for name, buffers in self.moves.items()})

    def built_for(self) -> dict:
        s = self.settings
        return {"tree_size": s.tree_size, "width": s.width, "branch": s.branch, "steps": s.steps,
                "mode": s.mode, "key": self.tree.key, "bias": s.bias, "replacement": s.replacement,
                "temperature": s.temperature}

    # ------------------------------------------------------------------ the phases of a round

    def _draft_step(self, step: int) -> None:
        self.book.draft_inputs(self.state, step)
        inputs = self.step_inputs[step]
        attend, workspace = self._d_attend[step], self._d_workspace[step]
        logits = self.draft.step(inputs.tokens, inputs.positions, self.d_cache, inputs.rows, attend,
                                 workspace=workspace, validate=False, padding=False, float_logits=False)
        if step == 0:
            logits = logits[:, 1:]  # the lag token's logits are not needed: its children were verified
        uniforms = None
        if self.mode == "sample":
            per_run = self.tree.uniforms_per_run(logits.shape[-1])
            count = self.plan.runs[step] * per_run
            uniforms = self._uniform_slice(self._draw_at[step], count).view(self.batch, -1, per_run)
        tokens, logp = self.tree.children(self._scaled(logits), inputs.ids, uniforms)
        self.book.add_children(self.state, step, tokens, logp)

    def _verify(self) -> None:
        self.book.choose(self.state)
        inputs = self.t_inputs
        logits = self.target.step(inputs.tokens, inputs.positions, self.t_cache, inputs.rows, self.t_attend,
                                  workspace=self.t_workspace, validate=False, padding=False,
                                  float_logits=False)
        if self.mode == "greedy":
            self.v_best.copy_(logits.argmax(dim=-1))
        else:
            bs = self.settings.tree_size
            self.v_p.copy_(torch.softmax(self._scaled(logits), dim=-1, dtype=torch.float32))
            self.v_q.copy_(self.tree.q.gather(1, self.chosen[..., None].expand(-1, -1, self.v_q.shape[-1])))
            self.v_accept.copy_(self._uniform_slice(self._verify_at, bs))
            self.v_sample.copy_(self._uniform_slice(self._verify_at + bs, bs))
        self.verifier()

    def _commit(self) -> None:
        """Move the accepted path's KV into both prefixes, emit its tokens, start the next trees."""
        self.book.commit(self.state)
        for name in ("target", "draft"):
            self.moves[name][3]()

    # ------------------------------------------------------------------ a generation

    def _prefill_all(self, prompts) -> None:
        self._prefill(self.target, self.t_cache, prompts)
        self._prefill(self.draft, self.d_cache, prompts)

    def start(self, prompts, max_new_tokens: int, eos=None, seed: int = 0) -> None:
        super().start(prompts, max_new_tokens, eos, seed)
        self.lag.zero_()
        reset_trees(self.state)

    def round(self) -> None:
        """Launch one round's phases (no wait for the GPU)."""
        for step in self.draft_steps:
            step()
        self.verify()
        self.commit()

    def _loop(self, max_new_tokens, eos, accepted, bar, trace, clock) -> tuple[int, int]:
        rounds = 0
        while True:
            for step in self.draft_steps:
                clock("draft")
                step()
            clock("verify")
            self.verify()
            if trace is not None:
                self._trace(trace, accepted)
            clock("commit")
            self.commit()
            clock("wait")
            rounds += 1
            done, count, emitted = self.status.tolist()  # the round's one wait for the GPU
            for b, a in enumerate(count):
                if a >= 0:
                    accepted[b].append(a)
            bar.n = sum(min(n, max_new_tokens) for n in emitted)
            bar.refresh()
            if all(done) or rounds > max_new_tokens:
                clock("end")
                return rounds, rounds * self.plan.steps

    def _trace(self, trace: list, accepted) -> None:
        """Per active sample: the draft tree, the nodes verified, the accepted path (tree ids) and the
        next token (for notebook 19's pictures; waits for the GPU)."""
        done = self.done.tolist()
        chosen, path, nxt = self.chosen.tolist(), self.path.tolist(), self.next_token.tolist()
        for b in range(self.batch):
            if done[b]:
                continue
            tree = self.tree.snapshot(b)
            trace.append({"round": len(accepted[b]), "sample": b, "parents": tree["parents"],
                          "tokens": tree["tokens"], "run": tree["run"], "chosen": chosen[b],
                          "path": [chosen[b][j] for j in path[b] if j >= 0], "next_token": nxt[b]})


# --------------------------------------------------------------------------- one-call functions


def _max_len(prompts, max_new_tokens: int) -> int:
    return max(len(p) for p in prompts) + max_new_tokens


@torch.no_grad()
def autoregressive(target, prompts, max_new_tokens: int, *, mode: str = "greedy", seed: int = 0,
                   backend: str = "kernels", impl: str | None = None, eos: int | None = None,
                   progress: bool = False, graphs: bool | None = None,
                   bookkeeping: str | None = None, temperature: float = 1.0) -> Generation:
    """Plain decoding of a batch of prompts with the target alone (see `PlainDecoder`); builds a
    decoder for this call. To time many calls, build a PlainDecoder once."""
    _check_model(target, "target")
    _positive_int(max_new_tokens, "max_new_tokens")
    prompts = check_prompts(prompts, target.config.vocab_size)
    decoder = PlainDecoder(target, batch=len(prompts), max_len=_max_len(prompts, max_new_tokens), mode=mode,
                           backend=backend, impl=impl, graphs=graphs, bookkeeping=bookkeeping,
                           temperature=temperature)
    return decoder.generate(prompts, max_new_tokens, seed=seed, eos=eos, progress=progress)


@torch.no_grad()
def speculative(target, draft, prompts, max_new_tokens: int, *, tree_size: int = 8, width: int = 2,
                branch: int | None = None, steps: int | None = None, mode: str = "greedy", seed: int = 0,
                backend: str = "kernels", impl: str | None = None, eos: int | None = None,
                progress: bool = False, trace: list | None = None, graphs: bool | None = None,
                bookkeeping: str | None = None, key: str | None = None, bias=None, replacement: bool = False,
                temperature: float = 1.0) -> Generation:
    """Tree speculative decoding of a batch of prompts (see the module docstring); builds a decoder
    for this call. To time many calls, build a SpeculativeDecoder once.

    prompts: token-id lists (course.capstone.text.encode); tree_size: the nodes verified per round;
    width: the nodes the draft runs per step (<= tree_size); branch: children per run node (default
    4); steps: draft steps per round (default ceil((tree_size - 1) / width)); width = branch = 1 is
    chain speculative decoding. mode: "greedy" or "sample"; seed: of every uniform; backend:
    "kernels" (the course's kernels, lessons/ or solutions/ per COURSE_IMPL or `impl`) or "reference"
    (torch); eos: a token id that ends a sample (None: run to max_new_tokens); trace: a list to which
    every round appends, per sample verified, a dict with the draft tree (parents, tokens, run), the
    nodes sent to the target (chosen), the accepted path (tree ids) and the next token (for notebook
    19's pictures); graphs: CUDA graphs (default: on a GPU with the kernels); key, bias: how nodes
    are ranked (`course.capstone.tree`); replacement: siblings drawn independently (SpecInfer) instead
    of without replacement (sample mode); temperature: of both models' distributions (sample mode).
    """
    cfg = settings(tree_size, width, branch, steps, mode, key=key, bias=bias, replacement=replacement,
                   temperature=temperature)
    _positive_int(max_new_tokens, "max_new_tokens")
    _check_pair(target, draft)
    prompts = check_prompts(prompts, target.config.vocab_size)
    decoder = SpeculativeDecoder(target, draft, batch=len(prompts), max_len=_max_len(prompts, max_new_tokens),
                                 tree_size=cfg.tree_size, width=cfg.width, branch=cfg.branch, steps=cfg.steps,
                                 mode=mode, backend=backend, impl=impl, graphs=graphs,
                                 bookkeeping=bookkeeping, key=cfg.key, bias=cfg.bias,
                                 replacement=cfg.replacement, temperature=cfg.temperature)
    return decoder.generate(prompts, max_new_tokens, seed=seed, eos=eos, progress=progress, trace=trace)


# --------------------------------------------------------------------------- text in, text out


def generate_text(target, draft, prompts, max_new_tokens: int, **options) -> tuple[list[str], Generation]:
    """`speculative` on text: prompts a str or a list of str (characters of
    course.capstone.text.VOCAB; anything else is refused, naming the character). Returns the
    continuations and the Generation."""
    from .text import decode

    result = speculative(target, draft, check_texts(prompts), max_new_tokens, **options)
    return [decode(t) for t in result.tokens], result


def check_texts(prompts) -> list[list[int]]:
    """Text prompts (a str or a non-empty list of str) as token ids; errors name the prompt and
    the first character outside course.capstone.text.VOCAB, or an empty prompt."""
    from .text import encode

    texts = [prompts] if isinstance(prompts, str) else prompts
    if not isinstance(texts, (list, tuple)) or not texts:
        raise ValueError("prompts must be a str or a non-empty list of str")
    encoded = []
    for b, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"prompts[{b}] must be a str, got {type(text).__name__}")
        if not text:
            raise ValueError(f"prompts[{b}] is empty: a prompt needs at least one character to continue")
        try:
            encoded.append(encode(text))
        except ValueError as error:
            raise ValueError(f"prompts[{b}]: {error}") from None
    return encoded


__all__ = ["BACKENDS", "MODES", "Decoder", "Generation", "PlainDecoder", "Settings", "SpeculativeDecoder",
           "autoregressive", "check_prompts", "check_texts", "generate_text", "prefill", "settings",
           "speculative"]
