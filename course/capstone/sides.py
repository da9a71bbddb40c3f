"""The two sides of tree speculative decoding, apart (notebook 20): what SwiftSpec's draft worker
and target worker each do (§3.1, Algorithm 1), for one prompt (B = 1), over the capstone decoder's
pieces.

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
Growth, the tree's bookkeeping and the kernels are the capstone's own (`decoder._draft`,
`tree.DraftTree`, `backends`); only the split is new here.
"""

from __future__ import annotations

import torch

from pyspec_ref.trees import dfs_times

from . import decoder
from .backends import make_backend
from .tree import DraftTree


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


class DraftSide:
    """The draft worker's state: its model, the [prefix | tree] KV cache, the tree (see the module
    docstring). cfg: `decoder.settings(...)`; steps: the draft steps taken while the target
    verifies (SwiftSpec's d); the tree holds at most 2 * tree_size + (steps + 1) * width nodes."""

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
        self.state: decoder._Batch | None = None
        self.sent: list[int] = []  # the draft ids of the last subtree sent
        self.calls = 0

    @property
    def tree(self) -> DraftTree:
        return self.state.trees[0]

    def start(self, prompt: list[int]) -> None:
        """Prefill the prompt but its last token, which becomes the root of a fresh tree."""
        _fits(prompt, self.max_prompt)
        self.state = decoder._Batch([prompt], self.max_new_tokens, None)
        self.state.trees = [DraftTree.fresh(prompt[-1], self.cfg.mode)]
        self.sent, self.calls = [], 0
        decoder._prefill(self.ops, self.model, self.cache, [prompt])

    def grow(self, steps: int = 0) -> int:
        """Run the root if it is new and top the tree up to tree_size nodes, in steps of as many
        nodes as were missing (SwiftSpec §3.2: a short tree "expands bs nodes immediately using one
        draft model inference"); then take `steps` steps of `width` nodes (as many as the tree's
        capacity allows). Returns the draft passes taken."""
        missing = max(self.cfg.width, self.cfg.tree_size - len(self.tree))
        calls = decoder._draft(self.ops, self.model, self.cache, self.state, self.cfg, self.gen, plan=0,
                               width=missing)
        room = max(0, (self.max_nodes - len(self.tree)) // self.cfg.width)
        if min(steps, room) > 0:
            calls += decoder._draft(self.ops, self.model, self.cache, self.state, self.cfg, self.gen,
                                    plan=min(steps, room))
        self.calls += calls
        return calls

    def subtree(self) -> tuple[list[int], list[int], torch.Tensor | None]:
        """The best tree_size nodes (`DraftTree.select`): parents over the subtree's own indices
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
        self.state.trees[0], moves = tree.reroot(committed, new_root, next_token, keep_subtree=True)
        P = self.state.prefix[0]
        self.ops.compact(self.cache.data, [[(P + s, P + d) for s, d in moves]])
        self.state.prefix[0] = P + len(committed)
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
        decoder._prefill(self.ops, self.model, self.cache, [prompt])
        self.prefix, self.last, self.calls = len(prompt) - 1, prompt[-1], 0

    def _check_subtree(self, parents: list[int], tokens: list[int]) -> None:
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

    def verify(self, parents: list[int], tokens: list[int], q: torch.Tensor | None = None
               ) -> tuple[list[int], int]:
        """One target pass over the subtree at rows P + j (`swiftspec.tree_cache_attention`), greedy
        verification or SpecInfer's speculative sampling (q: the draft's distributions, (n, V)), and
        the compaction of the accepted rows to the end of the prefix. Returns (path, next token)."""
        self._check_subtree(parents, tokens)
        n, P = len(parents), self.prefix
        device = self.cache.data.device
        depth = [0] * n
        for j in range(1, n):
            depth[j] = depth[parents[j]] + 1
        start, end = dfs_times(parents)
        tok, positions, rows, q_start, q_end = decoder._query_tensors(1, n)
        tok[0] = torch.tensor(tokens)
        positions[0] = P + torch.tensor(depth)
        rows[0] = P + torch.arange(n)
        q_start[0] = torch.tensor(start, dtype=torch.int32)
        q_end[0] = torch.tensor(end, dtype=torch.int32)
        ks, ke = decoder._kv_times(1, self.cache.capacity, [P], [(start, end)])
        attend = self.ops.tree(q_start, q_end, ks, ke, [P], [n], [n])
        logits = self.model.step(tok.to(device), positions.to(device), self.cache, rows.to(device), attend)
        self.calls += 1
        if self.cfg.mode == "greedy":
            paths, nexts = self.ops.verify_greedy([parents], [tokens], logits)
        else:
            accept_u = torch.rand((1, n), generator=self.gen, dtype=torch.float64)
            sample_u = torch.rand((1, n), generator=self.gen, dtype=torch.float64)
            p = torch.softmax(logits.float(), -1)
            paths, nexts = self.ops.verify_sample([parents], [tokens], q[None].to(p.device), p, accept_u,
                                                  sample_u)
        path, nxt = paths[0], nexts[0]
        self.ops.compact(self.cache.data, [[(P + j, P + i) for i, j in enumerate(path) if i != j]])
        self.prefix, self.last = P + len(path), nxt
        return path, nxt
