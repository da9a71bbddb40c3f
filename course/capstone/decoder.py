"""The capstone: a tree speculative decoder built from the course's kernels (notebook 19).

SpecInfer (Miao et al., 2024) verifies a whole token TREE of draft guesses with one target pass;
SwiftSpec grows that tree by maximum likelihood (§3.1) and keeps the draft's KV cache
[prefix | tree] so that the part of the tree that survives verification is reused (§3.2). A batch
of prompts is served at once in EMS-SD's unpadded layout (Ni et al., 2025, §3): every sample
keeps its own prefix length and accepts its own number of tokens.

One round, for every unfinished sample b with committed prefix P_b (the sequence without its last
token) and root = the last token:

1. Draft (`swiftspec.tree_cache_attention`, notebook 18): if the root is new, the draft runs it;
   then each draft step pops the w best candidates of the tree's priority queue
   (`course.capstone.tree.DraftTree`), writes their KV at tree rows P_b + id and runs them as w
   queries against [prefix | tree], each query seeing its ancestors. Their candidate children join
   the queue. Steps continue until the tree holds at least bs nodes, with at least one step per
   round unless a reused tree already holds 2 bs nodes.
2. Verify: the bs nodes chosen by `DraftTree.select` (the most probable subtree) go through the
   target in ONE pass (`tree_cache_attention` again, bs queries, rows P_b + j of the target's
   cache), then `tree_verification.greedy_tree_verification` (greedy) or
   `tree_speculative_sampling` (sampling, notebook 16) returns the accepted path and one more token.
3. Re-root and compact (`swiftspec.compact`): the accepted path's KV moves to the end of both
   prefixes; in the draft's cache the subtree of the emitted token (if the tree had it) follows,
   and the next round starts from it (in sampling mode only that node's KV is kept and its
   children are drawn afresh, see `DraftTree.reroot`). Everything else is dropped by moving nothing.

Prefill and the baseline use `emssd.unpadded_attention` (notebook 17): the prompts concatenated
with per-sample starts, and plain autoregressive decoding = one new token per sample (counts 1).

Exactness. Greedy mode emits exactly the target's greedy continuation: verification accepts a
token only if it is the target's argmax, and always adds the target's argmax at the last accepted
node (up to float rounding: the tree kernel and the baseline sum in different orders, so a near-tie
between two logits may break differently). Sampling mode's tokens follow the target's distribution
exactly (SpecInfer §4.3), because the draft's children are drawn from its distribution q (see
`course.capstone.tree` for why top-k children would break this). Random numbers are explicit:
a seeded torch.Generator draws every uniform, so the kernels and the reference backend given the
same seed see the same numbers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from .backends import BACKENDS, draw, make_backend
from .tree import MODES, DraftTree


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


def _check_pair(target, draft):
    for name, model in (("target", target), ("draft", draft)):
        if not hasattr(model, "step") or not hasattr(model, "config"):
            raise ValueError(f"{name} must be a course.capstone.model.TinyLM, got {type(model).__name__}")
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(f"target and draft must share the vocabulary: {target.config.vocab_size} vs "
                         f"{draft.config.vocab_size} tokens")
    if target.device != draft.device:
        raise ValueError(f"target and draft must be on one device, got {target.device} and {draft.device}")


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="tok", disable=not enabled, leave=False)


# --------------------------------------------------------------------------- shared pieces


def _prefill(backend, model, cache, prompts: list[list[int]]) -> None:
    """Every prompt but its last token into the cache, EMS-SD style (counts = prompt lengths - 1)."""
    counts = [len(p) - 1 for p in prompts]
    width = max(counts)
    if width == 0:
        return
    device = cache.data.device
    tokens = torch.zeros((len(prompts), width), dtype=torch.long)
    rows = torch.full((len(prompts), width), -1, dtype=torch.long)
    for b, p in enumerate(prompts):
        tokens[b, :counts[b]] = torch.tensor(p[:-1])
        rows[b, :counts[b]] = torch.arange(counts[b])
    positions = rows.clamp(min=0)
    model.step(tokens.to(device), positions.to(device), cache, rows.to(device),
               backend.causal(counts, [0] * len(prompts)))


def _finish(new: list[int], emitted: list[int], max_new: int, eos: int | None) -> tuple[list[int], bool]:
    """Append emitted tokens up to max_new and the first EOS; (the tokens appended, finished?)."""
    taken = []
    for t in emitted:
        if len(new) + len(taken) >= max_new:
            break
        taken.append(t)
        if eos is not None and t == eos:
            break
    new.extend(taken)
    done = len(new) >= max_new or (eos is not None and bool(taken) and taken[-1] == eos)
    return taken, done


# --------------------------------------------------------------------------- plain decoding


@torch.no_grad()
def autoregressive(target, prompts, max_new_tokens: int, *, mode: str = "greedy", seed: int = 0,
                   backend: str = "kernels", impl: str | None = None, eos: int | None = None,
                   progress: bool = False) -> Generation:
    """The baseline: the target alone, one token per sample per pass, `emssd.unpadded_attention` with
    counts = 1 (0 for finished samples). Greedy takes the argmax; sampling draws from the target's
    softmax with uniforms from a torch.Generator seeded with `seed`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    _positive_int(max_new_tokens, "max_new_tokens")
    prompts = check_prompts(prompts, target.config.vocab_size)
    if max(len(p) for p in prompts) + max_new_tokens > target.config.max_positions:
        raise ValueError(f"the longest prompt plus max_new_tokens = {max_new_tokens} exceeds the target's "
                         f"max_positions = {target.config.max_positions}")
    ops = make_backend(backend, impl)
    device = target.device
    batch = len(prompts)
    gen = torch.Generator().manual_seed(seed)
    cache = target.new_cache(batch, max(len(p) for p in prompts) + max_new_tokens)
    t0 = time.perf_counter()
    _prefill(ops, target, cache, prompts)
    _sync(device)
    t1 = time.perf_counter()
    prefix = [len(p) - 1 for p in prompts]
    last = [p[-1] for p in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    active = [True] * batch
    calls = 0
    bar = _progress(batch * max_new_tokens, "autoregressive", progress)
    while any(active):
        tokens = torch.tensor(last)[:, None]
        positions = torch.tensor(prefix)[:, None]
        rows = torch.tensor([P if a else -1 for P, a in zip(prefix, active, strict=True)])[:, None]
        counts = [int(a) for a in active]
        logits = target.step(tokens.to(device), positions.to(device), cache, rows.to(device),
                             ops.causal(counts, prefix))[:, 0]
        calls += 1
        if mode == "greedy":
            picks = logits.argmax(-1).tolist()
        else:
            probs = torch.softmax(logits.float(), -1).cpu()
            u = torch.rand(batch, generator=gen, dtype=torch.float64)
            picks = [draw(probs[b], u[b:b + 1])[0] for b in range(batch)]
        for b in range(batch):
            if active[b]:
                taken, done = _finish(new[b], [picks[b]], max_new_tokens, eos)
                bar.update(len(taken))
                prefix[b] += 1
                last[b] = picks[b]
                active[b] = not done
    _sync(device)
    t2 = time.perf_counter()
    bar.close()
    return Generation(new, t2 - t1, t1 - t0, calls, 0, [], mode, "autoregressive")


# --------------------------------------------------------------------------- speculative decoding


@dataclass(frozen=True)
class Settings:
    """The decoder's knobs, checked."""

    tree_size: int  # bs: nodes sent to the target per round (root included)
    width: int  # w: nodes the draft runs per draft step
    branch: int  # candidate children a run node offers (top-k in greedy, draws in sampling)
    mode: str

    @property
    def tree_cap(self) -> int:
        """No expansion step starts once a (reused) tree holds this many nodes."""
        return 2 * self.tree_size

    @property
    def max_tree(self) -> int:
        """The most nodes a tree can hold (the draft cache's tree capacity)."""
        return self.tree_cap + self.width  # tree_cap >= tree_size


def settings(tree_size=8, width=2, branch=None, mode="greedy") -> Settings:
    tree_size = _positive_int(tree_size, "tree_size")
    width = _positive_int(width, "width")
    if width > tree_size:
        raise ValueError(f"width = {width} must be <= tree_size = {tree_size}: the draft expands at most "
                         "as many nodes per step as the tree it sends for verification holds")
    branch = 4 if branch is None else _positive_int(branch, "branch")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return Settings(tree_size, width, branch, mode)


class _Batch:
    """Per-sample state of one speculative run."""

    def __init__(self, prompts, max_new, eos):
        self.prefix = [len(p) - 1 for p in prompts]  # committed tokens whose KV is cached
        self.trees: list[DraftTree] = []
        self.new: list[list[int]] = [[] for _ in prompts]
        self.accepted: list[list[int]] = [[] for _ in prompts]
        self.active = [True] * len(prompts)
        self.max_new, self.eos = max_new, eos


@torch.no_grad()
def speculative(target, draft, prompts, max_new_tokens: int, *, tree_size: int = 8, width: int = 2,
                branch: int | None = None, mode: str = "greedy", seed: int = 0, backend: str = "kernels",
                impl: str | None = None, eos: int | None = None, progress: bool = False,
                trace: list | None = None) -> Generation:
    """Tree speculative decoding of a batch of prompts (see the module docstring).

    prompts: token-id lists (course.capstone.text.encode); tree_size: bs, the nodes verified per
    round; width: w, the nodes the draft runs per step (<= tree_size); branch: candidate children
    per run node (default 4); mode: "greedy" or "sample"; seed: the torch.Generator of every uniform;
    backend: "kernels" (the course's kernels, lessons/ or solutions/ per COURSE_IMPL or `impl`) or
    "reference" (torch); eos: a token id that ends a sample (None: run to max_new_tokens);
    trace: a list to which every round appends, per sample verified, a dict with the draft tree
    (parents, tokens), the nodes sent to the target (chosen), the accepted path (draft node ids), the
    next token and whether the draft tree's subtree was reused (for notebook 19's pictures).
    """
    cfg = settings(tree_size, width, branch, mode)
    _positive_int(max_new_tokens, "max_new_tokens")
    _check_pair(target, draft)
    prompts = check_prompts(prompts, target.config.vocab_size)
    longest = max(len(p) for p in prompts)
    reach = longest + max_new_tokens + cfg.max_tree
    for name, model in (("target", target), ("draft", draft)):
        if reach > model.config.max_positions:
            raise ValueError(f"the longest prompt ({longest}) + max_new_tokens ({max_new_tokens}) + the "
                             f"deepest possible tree ({cfg.max_tree} = 2 * tree_size + width) is {reach}, "
                             f"more than the {name}'s max_positions = {model.config.max_positions}")
    if eos is not None and not 0 <= eos < target.config.vocab_size:
        raise ValueError(f"eos must be a token id in [0, {target.config.vocab_size}) or None, got {eos!r}")
    ops = make_backend(backend, impl)
    device = target.device
    batch = len(prompts)
    gen = torch.Generator().manual_seed(seed)
    prefix_room = longest + max_new_tokens + cfg.tree_size
    t_cache = target.new_cache(batch, prefix_room + cfg.tree_size)
    d_cache = draft.new_cache(batch, prefix_room + cfg.max_tree)
    state = _Batch(prompts, max_new_tokens, eos)
    state.trees = [DraftTree.fresh(p[-1], mode) for p in prompts]

    t0 = time.perf_counter()
    _prefill(ops, target, t_cache, prompts)
    _prefill(ops, draft, d_cache, prompts)
    _sync(device)
    t1 = time.perf_counter()
    bar = _progress(batch * max_new_tokens, f"speculative ({mode})", progress)
    target_calls = draft_calls = 0
    while any(state.active):
        draft_calls += _draft(ops, draft, d_cache, state, cfg, gen)
        _verify(ops, target, t_cache, draft, d_cache, state, cfg, gen, bar, trace)
        target_calls += 1
    _sync(device)
    t2 = time.perf_counter()
    bar.close()
    return Generation(state.new, t2 - t1, t1 - t0, target_calls, draft_calls, state.accepted, mode,
                      "speculative")


def _kv_times(batch: int, capacity: int, prefix: list[int], times: list[tuple[list[int], list[int]] | None]):
    """(B, C) int32 DFS start/end per cache row: tree row prefix[b] + i holds node i."""
    ks = torch.zeros((batch, capacity), dtype=torch.int32)
    ke = torch.zeros((batch, capacity), dtype=torch.int32)
    for b, t in enumerate(times):
        if t is not None:
            start, end = t
            ks[b, prefix[b]:prefix[b] + len(start)] = torch.tensor(start, dtype=torch.int32)
            ke[b, prefix[b]:prefix[b] + len(end)] = torch.tensor(end, dtype=torch.int32)
    return ks, ke


def _query_tensors(batch: int, width: int) -> tuple[torch.Tensor, ...]:
    """A step's (batch, width) queries, filled per sample by the caller: tokens, positions, cache
    rows (-1: a padding query, whose KV is not written), and the DFS times q_start, q_end."""
    return (torch.zeros((batch, width), dtype=torch.long), torch.zeros((batch, width), dtype=torch.long),
            torch.full((batch, width), -1, dtype=torch.long), torch.zeros((batch, width), dtype=torch.int32),
            torch.zeros((batch, width), dtype=torch.int32))


def _draft(ops, draft, cache, state: _Batch, cfg: Settings, gen, plan: int | None = None,
           width: int | None = None) -> int:
    """Grow every active sample's tree (SwiftSpec §3.1); returns the number of draft passes.
    plan, width: the expansion steps of every active sample and the nodes per step, instead of
    this round's own rule and cfg.width (the parallel workers of notebook 20 choose them; a short
    tree still grows to tree_size)."""
    batch = len(state.trees)
    device = cache.data.device
    steps = []  # expansion steps each sample still wants this round
    for b, tree in enumerate(state.trees):
        if not state.active[b]:
            steps.append(0)
            continue
        need = math.ceil(max(0, cfg.tree_size - len(tree)) / cfg.width)
        steps.append(max(need, 1 if len(tree) < cfg.tree_cap else 0))
    if plan is not None:
        steps = [plan if active else 0 for active in state.active]
    u = torch.rand((batch, cfg.branch), generator=gen, dtype=torch.float64) if cfg.mode == "sample" else None
    for b, tree in enumerate(state.trees):
        if state.active[b] and tree.needs_children():  # a sample-mode re-root: fresh draws from its q
            picks = draw(tree.q[0], u[b])
            tree.push(0, picks, torch.log(tree.q[0][picks].double()).tolist(), q=tree.q[0])
    calls = 0
    while True:
        run: list[list[int]] = [[] for _ in range(batch)]
        for b, tree in enumerate(state.trees):
            if not state.active[b]:
                continue
            if not tree.run[0]:
                run[b] = [0]  # a fresh root: the draft has not seen it yet
            elif steps[b] > 0 or len(tree) < cfg.tree_size:
                # Also past the planned steps while the tree is short: a step adds fewer than w
                # nodes when the queue holds fewer candidates (w > branch after a fresh root).
                run[b] = tree.pop(cfg.width if width is None else width)
                steps[b] = max(steps[b] - 1, 0)
        if not any(run):
            return calls
        width = max(len(r) for r in run)
        tokens, positions, rows, q_start, q_end = _query_tensors(batch, width)
        times: list = [None] * batch
        for b, nodes in enumerate(run):
            if not nodes:
                continue
            tree, P = state.trees[b], state.prefix[b]
            times[b] = start, end = tree.dfs_times()
            for r, v in enumerate(nodes):
                tokens[b, r] = tree.tokens[v]
                positions[b, r] = P + tree.depth[v]
                rows[b, r] = P + v
                q_start[b, r], q_end[b, r] = start[v], end[v]
        ks, ke = _kv_times(batch, cache.capacity, state.prefix, times)
        attend = ops.tree(q_start, q_end, ks, ke, state.prefix,
                          [len(t) if times[b] is not None else 0 for b, t in enumerate(state.trees)],
                          [len(r) for r in run])
        logits = draft.step(tokens.to(device), positions.to(device), cache, rows.to(device), attend)
        calls += 1
        logq = torch.log_softmax(logits.float(), -1)
        if cfg.mode == "greedy":
            values, picks = torch.topk(logq, min(cfg.branch, logq.shape[-1]), dim=-1)
            values, picks = values.cpu().tolist(), picks.cpu().tolist()
            for b, nodes in enumerate(run):
                for r, v in enumerate(nodes):
                    state.trees[b].push(v, picks[b][r], values[b][r])
        else:
            probs = torch.softmax(logits.float(), -1).cpu()
            logq = logq.cpu()
            u = torch.rand((batch, width, cfg.branch), generator=gen, dtype=torch.float64)
            for b, nodes in enumerate(run):
                for r, v in enumerate(nodes):
                    picks = draw(probs[b, r], u[b, r])
                    state.trees[b].push(v, picks, logq[b, r, picks].tolist(), q=probs[b, r])


def _verify(ops, target, t_cache, draft, d_cache, state: _Batch, cfg: Settings, gen, bar,
            trace: list | None = None) -> None:
    """One target pass over every active sample's chosen subtree, verification, re-rooting."""
    batch = len(state.trees)
    device = t_cache.data.device
    bs = cfg.tree_size
    live = [b for b in range(batch) if state.active[b]]
    chosen = {b: state.trees[b].select(bs) for b in live}
    tokens, positions, rows, q_start, q_end = _query_tensors(batch, bs)
    times: list = [None] * batch
    parents, node_tokens = {}, {}
    for b in live:
        tree, sel, P = state.trees[b], chosen[b], state.prefix[b]
        if len(sel) != bs:
            raise RuntimeError(f"sample {b}'s draft tree has {len(sel)} nodes, fewer than tree_size = {bs}")
        local = {v: j for j, v in enumerate(sel)}
        parents[b] = [-1 if tree.parents[v] < 0 else local[tree.parents[v]] for v in sel]
        node_tokens[b] = [tree.tokens[v] for v in sel]
        times[b] = start, end = tree.dfs_times(sel)
        for j, v in enumerate(sel):
            tokens[b, j] = tree.tokens[v]
            positions[b, j] = P + tree.depth[v]
            rows[b, j] = P + j
        q_start[b] = torch.tensor(start, dtype=torch.int32)
        q_end[b] = torch.tensor(end, dtype=torch.int32)
    ks, ke = _kv_times(batch, t_cache.capacity, state.prefix, times)
    attend = ops.tree(q_start, q_end, ks, ke, state.prefix, [bs if t is not None else 0 for t in times],
                      [bs if t is not None else 0 for t in times])
    logits = target.step(tokens.to(device), positions.to(device), t_cache, rows.to(device), attend)
    index = torch.tensor(live, device=logits.device)
    logits = logits.index_select(0, index)
    par_rows = [parents[b] for b in live]
    tok_rows = [node_tokens[b] for b in live]
    if cfg.mode == "greedy":
        paths, nexts = ops.verify_greedy(par_rows, tok_rows, logits)
    else:
        accept_u = torch.rand((batch, bs), generator=gen, dtype=torch.float64)[live]
        sample_u = torch.rand((batch, bs), generator=gen, dtype=torch.float64)[live]
        p = torch.softmax(logits.float(), -1)
        q = torch.stack([torch.stack([state.trees[b].q[v] for v in chosen[b]]) for b in live]).to(p.device)
        paths, nexts = ops.verify_sample(par_rows, tok_rows, q, p, accept_u, sample_u)
    t_moves: list[list[tuple[int, int]]] = [[] for _ in range(batch)]
    d_moves: list[list[tuple[int, int]]] = [[] for _ in range(batch)]
    for b, path, nxt in zip(live, paths, nexts, strict=True):
        tree, sel, P = state.trees[b], chosen[b], state.prefix[b]
        t_moves[b] = [(P + j, P + i) for i, j in enumerate(path) if i != j]
        committed = [sel[j] for j in path]
        last = committed[-1]
        new_root = next((c for c in range(last + 1, len(tree)) if tree.parents[c] == last
                         and tree.tokens[c] == nxt), None)
        emitted = [tree.tokens[v] for v in committed[1:]] + [nxt]
        if trace is not None:
            trace.append({"round": len(state.accepted[b]), "sample": b, "parents": list(tree.parents),
                          "tokens": list(tree.tokens), "chosen": list(sel), "path": committed,
                          "next_token": nxt, "reused": new_root is not None})
        state.trees[b], moves = tree.reroot(committed, new_root, nxt)
        d_moves[b] = [(P + s, P + d) for s, d in moves]
        state.prefix[b] = P + len(committed)
        state.accepted[b].append(len(committed) - 1)
        taken, done = _finish(state.new[b], emitted, state.max_new, state.eos)
        bar.update(len(taken))
        state.active[b] = not done
    ops.compact(t_cache.data, t_moves)
    ops.compact(d_cache.data, d_moves)


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


__all__ = ["BACKENDS", "MODES", "Generation", "Settings", "autoregressive", "check_prompts", "check_texts",
           "generate_text", "settings", "speculative"]
