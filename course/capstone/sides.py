"""The two sides of tree speculative decoding, apart (notebook 20): what SwiftSpec's draft worker
and target worker each do (§3.1, Algorithm 1), for one prompt (B = 1), over the capstone's pieces.

This is the narrow interface the parallel workers (`course.capstone.parallel`) are written against:

* `DraftSide`: `start(prompt)` (prefill), `grow(steps)` (run a new root, grow the tree to
  tree_size nodes, then `steps` more steps of `width` nodes), `subtree()` (the best tree_size
  nodes: parents, tokens and, in sampling mode, the draft distribution q of each), `reroot(path,
  next_token)` (SwiftSpec §3.2: commit the accepted path, keep the subtree of the next token if the
  tree has it, compact the KV cache);
* `TargetSide`: `start(prompt)`, `verify(parents, tokens, q)` (one target pass over the subtree,
  verification, compaction of the accepted rows): the accepted path and the next token.

Each side owns its model, its KV cache, its backend and its own random generator, so the two can
live in two processes on two GPUs and exchange only the messages of `pyspec_ref.parallel_tree`.
The prefill, the model step, the kernels behind the backend (tree attention, verification,
compaction) are the capstone decoder's own (`decoder.prefill`, `backends`). The draft's tree is
`host_tree.HostTree`, not the decoder's device tables: it outlives a round and keeps a subtree of
any shape, which a fixed round shape cannot. The steps run eagerly (no CUDA graphs): every call
builds its index buffers and prepares its kernels anew, which costs host time a graphed round
avoids (`decoder`'s docstring says why that matters).
"""

from __future__ import annotations

import torch

from pyspec_ref.trees import dfs_times

from . import decoder
from .backends import TreeIndex, inverse_cdf, make_backend
from .host_tree import HostTree


def _room(prompt_length: int, max_new_tokens: int, tree_rows: int, model, name: str) -> int:
    """Cache rows for a prompt, its continuation and a tree; a clear error past max_positions."""
    rows = prompt_length + max_new_tokens + tree_rows
    if rows > model.config.max_positions:
        raise ValueError(f"the prompt ({prompt_length}) + max_new_tokens ({max_new_tokens}) + the {name}'s "
                         f"tree rows ({tree_rows}) is {rows}, more than the {name}'s max_positions = "
                         f"{model.config.max_positions}")
    return rows


def _fits(prompt: list[int], max_prompt: int) -> None:
    if not 1 <= len(prompt) <= max_prompt:
        raise ValueError(f"a prompt of {len(prompt)} tokens; this side's cache was sized for 1 to "
                         f"{max_prompt}")


def _int32(values, device) -> torch.Tensor:
    """A batch of one: (1,) for a number, (1, n) for a list of n, int32 (the kernels' index type)."""
    return torch.tensor([values], dtype=torch.int32, device=device)


def _tree_step(ops, model, cache, prefix: int, times: tuple[list[int], list[int]], nodes: list[int],
               tokens: list[int], depths: list[int]) -> torch.Tensor:
    """One eager step of SwiftSpec's tree attention (notebook 18) for one sample: the tree's rows
    [prefix, prefix + T) carry DFS times `times` (FlashSpecInfer §5.1), and `nodes` (tree rows, with
    their tokens and depths) are run as queries, each seeing the prefix and its ancestors; their KV
    lands at rows prefix + node. Returns the logits (len(nodes), V) float32."""
    device = cache.data.device
    start, end = times
    kv_start = torch.zeros((1, cache.capacity + 1), dtype=torch.int32, device=device)
    kv_end = torch.zeros_like(kv_start)
    kv_start[0, prefix:prefix + len(start)] = torch.tensor(start, dtype=torch.int32)
    kv_end[0, prefix:prefix + len(end)] = torch.tensor(end, dtype=torch.int32)
    width = len(nodes)
    index = TreeIndex(_int32([start[v] for v in nodes], device), _int32([end[v] for v in nodes], device),
                      kv_start, kv_end, _int32(prefix, device), _int32(len(start), device),
                      _int32(width, device))
    workspace = model.workspace(1, width)
    attend = ops.tree_attention(model, cache, workspace, index)
    long = dict(dtype=torch.int64, device=device)
    positions = torch.tensor([[prefix + d for d in depths]], **long)
    rows = torch.tensor([[prefix + v for v in nodes]], **long)
    logits = model.step(torch.tensor([tokens], **long), positions, cache, rows, attend, workspace=workspace)
    return logits[0]


def _compact(ops, cache, moves: list[tuple[int, int]]) -> None:
    """SwiftSpec's in-place moves (src, dst) of whole cache rows (`swiftspec.compact`, notebook 18),
    dst increasing and dst <= src."""
    if not moves:
        return
    device = cache.data.device
    src, dst = _int32([s for s, _ in moves], device), _int32([d for _, d in moves], device)
    ops.compactor(cache, src, dst, _int32(len(moves), device))()


class DraftSide:
    """The draft worker's state: its model, the [prefix | tree] KV cache, the tree (see the module
    docstring). cfg: `decoder.settings(...)` (tree_size, width, branch, mode; its steps are the serial
    decoder's); steps: the draft steps taken while the target verifies (SwiftSpec's d); the tree holds
    at most 2 * tree_size + (steps + 1) * width nodes."""

    def __init__(self, draft, cfg: decoder.Settings, steps: int, *, max_prompt: int, max_new_tokens: int,
                 backend: str = "kernels", impl: str | None = None, seed: int = 0):
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be an int >= 0 (draft steps per round), got {steps!r}")
        self.model, self.cfg, self.steps = draft, cfg, steps
        self.max_nodes = 2 * cfg.tree_size + (steps + 1) * cfg.width  # a top-up may overshoot tree_size
        self.max_prompt, self.max_new_tokens = max_prompt, max_new_tokens
        rows = _room(max_prompt, max_new_tokens, self.max_nodes + cfg.tree_size, draft, "draft")
        self.cache = draft.new_cache(1, rows)
        self.ops = make_backend(backend, impl)
        self.gen = torch.Generator().manual_seed(seed)
        self.tree: HostTree | None = None
        self.prefix = 0  # committed tokens whose KV is cached (all but the root)
        self.sent: list[int] = []  # the draft ids of the last subtree sent
        self.calls = 0

    def start(self, prompt: list[int]) -> None:
        """Prefill the prompt but its last token, which becomes the root of a fresh tree."""
        _fits(prompt, self.max_prompt)
        self.tree = HostTree.fresh(prompt[-1], self.cfg.mode)
        self.prefix, self.sent, self.calls = len(prompt) - 1, [], 0
        decoder.prefill(self.ops, self.model, self.cache, [prompt])

    def _run(self, nodes: list[int]) -> None:
        """One draft pass over `nodes` (SwiftSpec §3.1): their KV into the cache, their candidate
        children into the queue (greedy: the top-`branch` tokens; sample: `branch` independent
        draws from q by inverse CDF, in draw order)."""
        tree, cfg = self.tree, self.cfg
        logits = _tree_step(self.ops, self.model, self.cache, self.prefix, tree.dfs_times(), nodes,
                            [tree.tokens[v] for v in nodes], [tree.depth[v] for v in nodes])
        self.calls += 1
        logq = torch.log_softmax(logits.float(), -1).cpu()
        if cfg.mode == "greedy":
            values, picks = torch.topk(logq, min(cfg.branch, logq.shape[-1]), dim=-1)
            for r, v in enumerate(nodes):
                tree.push(v, picks[r].tolist(), values[r].tolist())
            return
        probs = logq.exp()
        u = torch.rand((len(nodes), cfg.branch), generator=self.gen, dtype=torch.float64)
        picks = inverse_cdf(probs, u)
        for r, v in enumerate(nodes):
            tree.push(v, picks[r].tolist(), logq[r, picks[r]].tolist(), q=probs[r])

    def _expand(self, steps: int, width: int) -> int:
        """Run the root if the draft has not, then `steps` steps of `width` nodes, and more while the
        tree holds fewer than tree_size nodes (a step adds fewer than `width` nodes when the queue
        holds fewer candidates); stops early when the queue runs dry. Returns the passes taken."""
        calls = 0
        while True:
            if not self.tree.run[0]:
                nodes = [0]  # a fresh root: the draft has not seen it yet
            elif steps > 0 or len(self.tree) < self.cfg.tree_size:
                nodes = self.tree.pop(width)
                steps = max(steps - 1, 0)
            else:
                return calls
            if not nodes:
                return calls
            self._run(nodes)
            calls += 1

    def grow(self, steps: int = 0) -> int:
        """Run the root if it is new and top the tree up to tree_size nodes, in steps of as many
        nodes as were missing (SwiftSpec §3.2: a short tree "expands bs nodes immediately using one
        draft model inference"); then take `steps` steps of `width` nodes (as many as the tree's
        capacity allows). Returns the draft passes taken."""
        missing = max(self.cfg.width, self.cfg.tree_size - len(self.tree))
        calls = self._expand(0, missing)
        room = max(0, (self.max_nodes - len(self.tree)) // self.cfg.width)
        if min(steps, room) > 0:
            calls += self._expand(min(steps, room), self.cfg.width)
        return calls

    def subtree(self) -> tuple[list[int], list[int], torch.Tensor | None]:
        """The best tree_size nodes (`HostTree.select`): parents over the subtree's own indices
        (root first, parents before children), tokens, and q (nodes, V) float32 in sampling mode."""
        tree = self.tree
        chosen = tree.select(self.cfg.tree_size)
        local = {v: j for j, v in enumerate(chosen)}
        self.sent = chosen
        parents = [-1 if tree.parents[v] < 0 else local[tree.parents[v]] for v in chosen]
        q = torch.stack([tree.q[v] for v in chosen]).float() if self.cfg.mode == "sample" else None
        return parents, [tree.tokens[v] for v in chosen], q

    def reroot(self, path: list[int], next_token: int) -> int | None:
        """SwiftSpec §3.2 after ACCEPTED(path, next_token) for the last subtree: the path joins the
        prefix, the subtree of the last node's child holding next_token survives (if the tree has
        one), and the KV cache's rows move left to match. Returns the new root's old id, or None."""
        tree = self.tree
        if not path or path[0] != 0 or max(path) >= len(self.sent):
            raise ValueError(f"path {path} is not a path of the {len(self.sent)}-node subtree sent last")
        committed = [self.sent[j] for j in path]
        last = committed[-1]
        new_root = next((c for c in range(last + 1, len(tree)) if tree.parents[c] == last
                         and tree.tokens[c] == next_token), None)
        self.tree, moves = tree.reroot(committed, new_root, next_token)
        P = self.prefix
        _compact(self.ops, self.cache, [(P + s, P + d) for s, d in moves])
        self.prefix = P + len(committed)
        return new_root


class TargetSide:
    """The target worker's state: its model, its KV cache, the committed sequence's length."""

    def __init__(self, target, cfg: decoder.Settings, *, max_prompt: int, max_new_tokens: int,
                 backend: str = "kernels", impl: str | None = None, seed: int = 1):
        self.model, self.cfg = target, cfg
        self.max_prompt, self.max_new_tokens = max_prompt, max_new_tokens
        rows = _room(max_prompt, max_new_tokens, 2 * cfg.tree_size, target, "target")
        self.cache = target.new_cache(1, rows)
        self.ops = make_backend(backend, impl)
        self.gen = torch.Generator().manual_seed(seed)
        self.prefix = 0  # committed tokens whose KV is cached (all but the last one)
        self.last = -1  # the last committed token: the root the next subtree must have
        self.calls = 0

    def start(self, prompt: list[int]) -> None:
        """Prefill the prompt but its last token, the root the first subtree must have."""
        _fits(prompt, self.max_prompt)
        decoder.prefill(self.ops, self.model, self.cache, [prompt])
        self.prefix, self.last, self.calls = len(prompt) - 1, prompt[-1], 0

    def _check_subtree(self, parents: list[int], tokens: list[int], q) -> None:
        n = len(parents)
        if not 1 <= n <= self.cfg.tree_size or len(tokens) != n:
            raise ValueError(f"a subtree of {n} nodes and {len(tokens)} tokens; expected 1 to "
                             f"{self.cfg.tree_size} nodes, one token each")
        if parents[0] != -1 or any(not 0 <= p < j for j, p in enumerate(parents) if j):
            raise ValueError(f"subtree parents {parents} are not a tree rooted at 0 with parents before "
                             "children")
        if tokens[0] != self.last:
            raise ValueError(f"the subtree is rooted at token {tokens[0]}, but the last committed token is "
                             f"{self.last}: the draft did not re-root on the accepted path")
        vocab = self.model.config.vocab_size
        if any(not 0 <= t < vocab for t in tokens):
            raise ValueError(f"subtree tokens {tokens} are not all token ids in [0, {vocab})")
        if self.cfg.mode == "sample" and (not isinstance(q, torch.Tensor) or tuple(q.shape) != (n, vocab)):
            raise ValueError(f"sampling needs q, the draft's distributions at the {n} nodes, of shape "
                             f"({n}, {vocab}); got {tuple(q.shape) if isinstance(q, torch.Tensor) else q!r}")

    def _verdict(self, parents: list[int], tokens: list[int], q, logits: torch.Tensor
                 ) -> tuple[list[int], int]:
        """SpecInfer's verification over the subtree (notebook 16): greedy, or multi-step
        speculative sampling with this side's uniforms."""
        n, device = len(parents), logits.device
        par, tok = _int32(parents, device), _int32(tokens, device)
        if self.cfg.mode == "greedy":
            best = logits.argmax(dim=-1).to(torch.int32)[None]
            path, nxt = self.ops.greedy_verifier(par, tok, best)()
        else:
            accept_u = torch.rand((1, n), generator=self.gen, dtype=torch.float64).to(device)
            sample_u = torch.rand((1, n), generator=self.gen, dtype=torch.float64).to(device)
            p = torch.softmax(logits.float(), -1)[None].contiguous()
            path, nxt = self.ops.sampling_verifier(par, tok, q[None].to(device=device, dtype=torch.float32)
                                                   .contiguous(), p, accept_u, sample_u)()
        return [j for j in path[0].tolist() if j >= 0], int(nxt[0])

    def verify(self, parents: list[int], tokens: list[int], q: torch.Tensor | None = None
               ) -> tuple[list[int], int]:
        """One target pass over the subtree at rows P + j (`swiftspec.tree_cache_attention`), greedy
        verification or SpecInfer's speculative sampling (q: the draft's distributions, (n, V)), and
        the compaction of the accepted rows to the end of the prefix. Returns (path, next token)."""
        self._check_subtree(parents, tokens, q)
        n, P = len(parents), self.prefix
        depth = [0] * n
        for j in range(1, n):
            depth[j] = depth[parents[j]] + 1
        logits = _tree_step(self.ops, self.model, self.cache, P, dfs_times(parents), list(range(n)), tokens,
                            depth)
        self.calls += 1
        path, nxt = self._verdict(parents, tokens, q, logits)
        _compact(self.ops, self.cache, [(P + j, P + i) for i, j in enumerate(path) if i != j])
        self.prefix, self.last = P + len(path), nxt
        return path, nxt
