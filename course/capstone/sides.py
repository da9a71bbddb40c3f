"""The two sides of tree speculative decoding, apart (notebook 20): what SwiftSpec's draft worker
and target worker each do (§3.1, Algorithm 1), for one prompt (B = 1), over the capstone's pieces.

This is the narrow interface the parallel workers (`course.capstone.protocol`) are written against:

* `DraftSide`: `start(prompt)` (prefill), `grow(steps)` (run a new root, grow the tree until
  tree_size items can be sent, then `steps` more steps of `width` nodes), `subtree()` (the best
  tree_size items, nodes and queued candidates as leaves: parents, tokens and, in sampling mode,
  the draft distribution q of each), `reroot(path, next_token)` (SwiftSpec §3.2: commit the
  accepted path, running its last node first if it was a leaf never run, keep the subtree of the
  next token if the tree has it, compact the KV cache);
* `TargetSide`: `start(prompt)`, `verify(parents, tokens, q)` (one target pass over the subtree,
  verification, compaction of the accepted rows): the accepted path and the next token.

Each side owns its model, its KV cache, its backend and its own random generator, so the two can
live in two processes on two GPUs and exchange only the messages of `pyspec_ref.parallel_tree`.
The prefill, the model step, the kernels behind the backend (tree attention, verification,
compaction) are the capstone decoder's own (`decoder.prefill`, `backends`). The draft's tree is
`host_tree.HostTree`, not the decoder's device tables: it outlives a round and keeps a subtree of
any shape, which a fixed round shape cannot (`device_side.DeviceDraftSide` keeps the same tree in
device tables of a fixed capacity instead). Every model pass runs through `side_steps`: static
buffers per query count, one CUDA graph each on a GPU, built when the side is; a side is built once
and serves any number of generations (`start` begins one).
"""

from __future__ import annotations

import torch

from . import decoder
from .backends import make_backend
from .host_tree import HostTree, dfs_times_of
from .side_steps import MoveBuffers, Steps, TreeStep, UniformPool
from .tree import gumbel_top_k, top_children

TIMED_EVERY = 8  # the target's passes timed on the GPU: one in this many
POOLED = 64  # the target's verifications whose sampling uniforms are drawn at once
GROWTHS = ("best", "likely")  # pyspec_ref.parallel_tree's rules for the steps taken during verification


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


def set_up_draft(side, draft, cfg: decoder.Settings, steps: int, *, max_prompt: int, max_new_tokens: int,
                 backend: str, impl: str | None, seed: int, graphs: bool | None, growth: str) -> bool:
    """What every draft side sets up alike (`DraftSide`, `device_side.DeviceDraftSide`): the checked
    settings, the node capacity max_nodes = 2 * tree_size + (steps + 1) * width (a top-up may overshoot
    tree_size) and tree_rows = max_nodes + tree_size KV rows for the tree, the KV cache, the backend
    and the generator. Returns whether to capture CUDA graphs."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0 (draft steps per round), got {steps!r}")
    if growth not in GROWTHS:
        raise ValueError(f"growth must be one of {GROWTHS}, got {growth!r}")
    side.model, side.cfg, side.steps, side.growth = draft, cfg, steps, growth
    side.max_nodes = 2 * cfg.tree_size + (steps + 1) * cfg.width
    side.max_prompt, side.max_new_tokens = max_prompt, max_new_tokens
    side.tree_rows = side.max_nodes + cfg.tree_size
    side.rows = _room(max_prompt, max_new_tokens, side.tree_rows, draft, "draft")
    side.cache = draft.new_cache(1, side.rows)
    side.ops = make_backend(backend, impl)
    side.gen = torch.Generator().manual_seed(seed)
    return decoder._check_graphs(graphs, backend, draft.device)


class DraftSide:
    """The draft worker's state: its model, the [prefix | tree] KV cache, the tree (see the module
    docstring). cfg: `decoder.settings(...)` (tree_size, width, branch, mode; its steps are the serial
    decoder's); steps: the draft steps taken while the target verifies (SwiftSpec's d); the tree holds
    at most 2 * tree_size + (steps + 1) * width nodes. graphs: CUDA graphs for the passes (default:
    on a GPU with the kernels), one per pass width from 1 to tree_size, captured here. growth: how
    the steps taken during verification pick their candidates (`pyspec_ref.parallel_tree`'s rules:
    "best" keys, or "likely", the likeliest to outlive the re-root)."""

    def __init__(self, draft, cfg: decoder.Settings, steps: int, *, max_prompt: int, max_new_tokens: int,
                 backend: str = "kernels", impl: str | None = None, seed: int = 0,
                 graphs: bool | None = None, growth: str = "likely"):
        graphs = set_up_draft(self, draft, cfg, steps, max_prompt=max_prompt, max_new_tokens=max_new_tokens,
                              backend=backend, impl=impl, seed=seed, graphs=graphs, growth=growth)
        tree_rows = self.tree_rows
        # Sampling: each pass's Gumbel uniforms, (width, V) float64, drawn on the host.
        self.uniforms = torch.zeros((cfg.tree_size, draft.config.vocab_size), dtype=torch.float64,
                                    device=draft.device)
        self.passes = Steps(lambda width, graphed: TreeStep(self.ops, draft, self.cache, width, tree_rows,
                                                            self._finish, graphs=graphed),
                            range(1, cfg.tree_size + 1) if graphs else (), graphs)
        self.move = MoveBuffers(self.ops, self.cache, tree_rows)
        self.tree: HostTree | None = None
        self.prefix = 0  # committed tokens whose KV is cached (all but the root)
        self.sent: list = []  # the last subtree sent: node ids, and queue entries of the leaves
        self.calls = 0

    def start(self, prompt: list[int], seed: int | None = None) -> None:
        """Prefill the prompt but its last token, which becomes the root of a fresh tree; seed:
        restart the side's generator (sampling) from it."""
        _fits(prompt, self.max_prompt)
        if seed is not None:
            self.gen.manual_seed(seed)
        self.tree = HostTree.fresh(prompt[-1], self.cfg.mode)
        self.prefix, self.sent, self.calls = len(prompt) - 1, [], 0
        decoder.prefill(self.ops, self.model, self.cache, [prompt])

    def _finish(self, logits: torch.Tensor, prefix: torch.Tensor, extra: torch.Tensor):
        """After the draft pass, in its graph: each query's candidate children (greedy: the
        top-`branch` tokens; sample: `branch` draws from q without replacement by Gumbel top-k,
        in draw order) as one (width, 2 * branch + 1) float64 table [log q of each, token ids, log of the
        top probability]; sample mode also returns q (width, V) float32, kept for the
        verification."""
        logq = torch.log_softmax(logits.float(), -1)
        top = logq.max(dim=-1, keepdim=True).values.double()
        if self.cfg.mode == "greedy":
            picks, values, _ = top_children(logq, self.cfg.branch)
            return torch.cat([values.double(), picks.double(), top], dim=1)
        probs = logq.exp()
        picks = gumbel_top_k(logq, self.uniforms[:logits.shape[0]], self.cfg.branch)
        return torch.cat([logq.gather(1, picks).double(), picks.double(), top], dim=1), probs

    def _run(self, nodes: list[int]) -> None:
        """One draft pass over `nodes` (SwiftSpec §3.1): their KV into the cache, their candidate
        children into the queue."""
        tree, width = self.tree, len(nodes)
        if self.prefix + len(tree) > self.rows:  # never reached by grow's limits; a wrong row is worse
            raise ValueError(f"the draft tree holds {len(tree)} nodes after a prefix of {self.prefix}: more "
                             f"than the {self.rows} rows of its KV cache (max_nodes = {self.max_nodes})")
        step = self.passes[width]
        step.load(self.prefix, tree.dfs_times(), nodes, [tree.tokens[v] for v in nodes],
                  [tree.depth[v] for v in nodes])
        if self.cfg.mode == "sample":
            self.uniforms[:width].copy_(torch.rand((width, self.uniforms.shape[1]), generator=self.gen,
                                                   dtype=torch.float64))
        out = step.run()
        self.calls += 1
        q = None
        if self.cfg.mode == "sample":
            out, q = out[0], out[1].float().cpu()
        table = out.tolist()  # one copy to the host; then plain lists (per-row tensor slices cost more)
        branch = len(table[0]) // 2
        for r, v in enumerate(nodes):
            row = table[r]
            tree.push(v, [int(t) for t in row[branch:2 * branch]], row[:branch],
                      q=None if q is None else q[r], top=row[-1])

    def grow(self, steps: int = 0, ahead: bool = False) -> int:
        """Run the root if it is new and top the tree up until tree_size items (nodes and queued
        candidates) can be sent, each pass running as few nodes as the missing count needs (each
        queues `branch` candidates; SwiftSpec §3.2: a short tree "expands bs nodes immediately using
        one draft model inference"); then take `steps` steps of `width` nodes (as many as the
        tree's capacity allows). ahead: these steps are taken while the target verifies the subtree
        sent last; under growth "likely" they pop the candidates likeliest to outlive the re-root
        (`HostTree.pop`). Returns the draft passes taken."""
        tree, size, branch = self.tree, self.cfg.tree_size, self.cfg.branch
        calls = 0
        if not tree.run[0]:
            self._run([0])  # a fresh root: the draft has not seen it yet
            calls += 1
        while tree.heap and tree.selectable() < size:
            self._run(tree.pop(-(-(size - tree.selectable()) // branch)))
            calls += 1
        sent = None
        if ahead and self.growth == "likely":
            sent = {v[1] for v in self.sent if not isinstance(v, int)}
        for _ in range(min(steps, max(0, (self.max_nodes - len(tree)) // self.cfg.width))):
            if not tree.heap:
                break
            self._run(tree.pop(self.cfg.width, sent))
            calls += 1
        return calls

    def subtree(self) -> tuple[list[int], list[int], torch.Tensor | None]:
        """The best tree_size items (`HostTree.select`: nodes, and queued candidates as leaves):
        parents over the subtree's own indices (root first, parents before children), tokens, and
        q (items, V) float32 in sampling mode (a leaf's is never read: uniform)."""
        tree = self.tree
        chosen = tree.select(self.cfg.tree_size)
        self.sent = chosen
        node_of = [v if isinstance(v, int) else v[2] for v in chosen]  # a leaf: its parent's node
        local = {v: j for j, v in enumerate(chosen) if isinstance(v, int)}
        parents = [-1 if v == 0 else local[tree.parents[v] if isinstance(v, int) else node_of[j]]
                   for j, v in enumerate(chosen)]
        tokens = [tree.tokens[v] if isinstance(v, int) else v[3] for v in chosen]
        q = None
        if self.cfg.mode == "sample":
            vocab = self.model.config.vocab_size
            leaf = torch.full((vocab,), 1.0 / vocab)
            q = torch.stack([tree.q[v] if isinstance(v, int) else leaf for v in chosen]).float()
        return parents, tokens, q

    def reroot(self, path: list[int], next_token: int, owe: bool = False) -> int | None:
        """SwiftSpec §3.2 after ACCEPTED(path, next_token) for the last subtree: the path joins the
        prefix, the subtree of the last node's child holding next_token survives (if the tree has
        one), and the KV cache's rows move left to match. Returns the new root's old id, or None.
        owe (the queued schedule: an accepted leaf still queued committed unrun) is the device
        tree's alone: this tree runs such a leaf at once with the next token."""
        if owe:
            raise ValueError("the queued schedule needs the draft's tree on the device "
                             "(draft_tree='device'): the host tree runs an accepted leaf at once")
        tree = self.tree
        if not path or path[0] != 0 or max(path) >= len(self.sent):
            raise ValueError(f"path {path} is not a path of the {len(self.sent)}-node subtree sent last")
        committed = [self.sent[j] for j in path]
        if not isinstance(committed[-1], int):  # a leaf (only a path's last node can be one)
            order = committed[-1][1]
            if order in tree.popped:  # grown while the target verified it
                committed[-1] = tree.popped[order]
            else:  # still queued: it and the next token, run in one pass
                leaf, child = tree.adopt(committed[-1], next_token)
                self._run([leaf, child])
                committed[-1] = leaf
        last = committed[-1]
        new_root = next((c for c in range(last + 1, len(tree)) if tree.parents[c] == last
                         and tree.tokens[c] == next_token), None)
        self.tree, moves = tree.reroot(committed, new_root, next_token)
        P = self.prefix
        self.move([(P + s, P + d) for s, d in moves])
        self.prefix = P + len(committed)
        return new_root


class _Verification:
    """The target's pass over an n-node subtree with static buffers (`side_steps.TreeStep`): the
    model step, SpecInfer's verification (notebook 16: greedy, or multi-step speculative sampling)
    and the compaction of the accepted rows to the end of the prefix, all in one graph on a GPU."""

    def __init__(self, side: TargetSide, n: int, graphed: bool):
        ops, model, cache, mode = side.ops, side.model, side.cache, side.cfg.mode
        device, vocab = cache.data.device, model.config.vocab_size
        int32 = dict(dtype=torch.int32, device=device)
        self.n, self.mode = n, mode
        self.parents = torch.arange(-1, n - 1, **int32)[None].contiguous()  # a chain: valid for the checks
        self.tokens = torch.zeros((1, n), **int32)
        if mode == "greedy":
            self.best = torch.zeros((1, n), **int32)
            self.verifier = ops.greedy_verifier(self.parents, self.tokens, self.best)
        else:
            self.q = torch.full((1, n, vocab), 1.0 / vocab, dtype=torch.float32, device=device)
            self.p = torch.full((1, n, vocab), 1.0 / vocab, dtype=torch.float32, device=device)
            self.uniforms = torch.zeros((2, n), dtype=torch.float64, device=device)  # accept, sample
            self.pool = side.uniforms
            # The draft draws a node's siblings without replacement (`host_tree`): Sequoia's rule.
            self.verifier = ops.sampling_verifier(self.parents, self.tokens, self.q, self.p,
                                                  self.uniforms[0:1], self.uniforms[1:2], replacement=False)
        self.src, self.dst = torch.zeros((1, n), **int32), torch.zeros((1, n), **int32)
        self.counts = torch.zeros(1, **int32)
        self.compact = ops.compactor(cache, self.src, self.dst, self.counts)
        self.slots = torch.arange(n, device=device)
        # Last: on a GPU this captures the pass, whose finish uses everything above.
        self.step = TreeStep(ops, model, cache, n, n, self._finish, extra=[-1, *range(n - 1), *[0] * n],
                             graphs=graphed)

    def _finish(self, logits: torch.Tensor, prefix: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        """Verify, move the accepted path's rows P + path[i] to P + i; (path padded with -1, next)."""
        n = self.n
        self.parents[0].copy_(extra[:n])
        self.tokens[0].copy_(extra[n:])
        if self.mode == "greedy":
            self.best[0].copy_(logits.argmax(dim=-1))
        else:
            self.p[0].copy_(torch.softmax(logits.float(), dim=-1))
            self.uniforms.copy_(self.pool.take(2)[:, :n])
        path, nxt = self.verifier()
        self.src.copy_(prefix + path.clamp(min=0))
        self.dst[0].copy_(prefix + self.slots)
        self.counts.copy_((path >= 0).sum(dim=1))
        self.compact()
        return torch.cat([path[0].long(), nxt.long()])


class TargetSide:
    """The target worker's state: its model, its KV cache, the committed sequence's length. graphs:
    as DraftSide's; the pass over a whole tree_size subtree is captured here (a smaller subtree, when
    the draft's queue ran dry, runs the same code uncaptured)."""

    def __init__(self, target, cfg: decoder.Settings, *, max_prompt: int, max_new_tokens: int,
                 backend: str = "kernels", impl: str | None = None, seed: int = 1,
                 graphs: bool | None = None):
        self.model, self.cfg = target, cfg
        self.max_prompt, self.max_new_tokens = max_prompt, max_new_tokens
        rows = _room(max_prompt, max_new_tokens, 2 * cfg.tree_size, target, "target")
        self.cache = target.new_cache(1, rows)
        self.ops = make_backend(backend, impl)
        self.gen = torch.Generator().manual_seed(seed)
        # Sampling: each verification's uniforms (accept, sample: two rows of tree_size), drawn on
        # the host many verifications at a time, for the reason `UniformPool` gives.
        self.uniforms = (UniformPool(2, cfg.tree_size, self.gen, self.cache.data.device, rows=2 * POOLED)
                         if cfg.mode == "sample" else None)
        self.graphs = decoder._check_graphs(graphs, backend, target.device)
        self.passes = Steps(lambda n, graphed: _Verification(self, n, graphed),
                            (cfg.tree_size,) if self.graphs else (), self.graphs)
        self.prefix = 0  # committed tokens whose KV is cached (all but the last one)
        self.last = -1  # the last committed token: the root the next subtree must have
        self.calls = 0
        # On a GPU, the pass's own time (CUDA events around the graph) apart from the host's work
        # before and after it, which the bench subtracts to see the host's share of a round. One
        # verification in TIMED_EVERY: an event costs the host microseconds on the critical path.
        on_gpu = self.cache.data.device.type == "cuda"
        self._marks = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if on_gpu else None
        self.pass_ms: float | None = None  # the last verification's, when it was timed
        if self.uniforms is not None:
            self.uniforms.restart()  # the capture above moved the device's cursor

    def start(self, prompt: list[int], seed: int | None = None) -> None:
        """Prefill the prompt but its last token, the root the first subtree must have; seed: as
        DraftSide.start's."""
        _fits(prompt, self.max_prompt)
        if seed is not None:
            self.gen.manual_seed(seed)
            if self.uniforms is not None:
                self.uniforms.restart()
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

    def _timed(self, launch, timed: bool):
        """launch(), between two CUDA events if timed (the pass's own time)."""
        if not timed:
            return launch()
        self._marks[0].record()
        out = launch()
        self._marks[1].record()
        return out

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
        verification = self.passes[n]
        if self.cfg.mode == "sample":
            verification.q[0].copy_(q)
            self.uniforms.reserve(2)
        verification.step.load(P, dfs_times_of(parents), range(n), tokens, depth, extra=[*parents, *tokens])
        timed = bool(self._marks) and self.calls % TIMED_EVERY == 0
        result = self._timed(verification.step.run, timed).tolist()  # the one wait for the GPU
        self.pass_ms = self._marks[0].elapsed_time(self._marks[1]) if timed else None
        self.calls += 1
        path = [j for j in result[:n] if j >= 0]
        self.prefix, self.last = P + len(path), result[n]
        return path, result[n]
