"""The draft worker of notebook 20 with its tree on the device (`device_tree.DeviceTree`): the same
interface and the same tree, pass for pass, as `sides.DraftSide`, whose tree is on the host.

`DraftSide` copies each pass's inputs to the GPU and the pass's candidates back, so every draft
pass waits for the GPU and then for Python's bookkeeping. Here a pass is one CUDA graph that picks
its queries, computes the tree's DFS times, runs the draft model and writes the children into the
tables: the host only launches. What the host must still choose, the width of the next pass, it
computes from a mirror of the counts (each pass adds `branch` candidates per node it runs), so the
growth taken while the target verifies is queued on the GPU at once and costs the host nothing.
The host waits twice a round: for the subtree it sends (`subtree`, one copy of 2 * tree_size ints)
and after a re-root (four ints: the survivors' counts). Sampling draws its Gumbel uniforms on the
host from the side's generator, in the same order as `DraftSide`, so both sides send the same
subtrees for the same seed (the tests hold them equal). They reach the GPU many passes at a time
(`UniformPool`), so that launching a sampling pass costs the host no more than a greedy one.
"""

from __future__ import annotations

import torch

from . import decoder
from .backends import TreeIndex
from .device_tree import DeviceTree, Queries
from .side_steps import UniformPool, host_ints
from .sides import _fits, set_up_draft


class _Pass:
    """One draft pass over `width` new nodes (and, when `owed`, first the committed token whose KV
    the last re-root could not move): static buffers, one graph on a GPU."""

    def __init__(self, side: DeviceDraftSide, width: int, owed: bool):
        self.side, self.width, self.owed = side, width, owed
        queries = width + owed
        device = side.cache.data.device
        int32 = dict(dtype=torch.int32, device=device)
        rows = side.cache.capacity + 1
        self.index = TreeIndex(torch.zeros((1, queries), **int32), torch.zeros((1, queries), **int32),
                               torch.zeros((1, rows), **int32), torch.zeros((1, rows), **int32),
                               torch.zeros(1, **int32), torch.ones(1, **int32),
                               torch.full((1,), queries, **int32))
        self.workspace = side.model.workspace(1, queries)
        self.attend = side.ops.tree_attention(side.model, side.cache, self.workspace, self.index)
        self.queries = Queries.empty(width, owed, device)

    def __call__(self) -> None:
        side, queries = self.side, self.queries
        side.tree.pop_queries(self.width, self.owed, queries, self.index, side.cache.scratch_row)
        logits = side.model.step(queries.tokens[None], queries.positions[None], side.cache,
                                 queries.cache_rows[None], self.attend, workspace=self.workspace,
                                 validate=False, padding=False, float_logits=False)[0]
        side.children(queries.rows, logits[int(self.owed):], self.owed)


class DeviceDraftSide:
    """`sides.DraftSide` with the tree on the device (see the module docstring); the same arguments.
    The tables hold 1 + slots * branch rows, slots = 2 * tree_size + (steps + 1) * width + tree_size
    node slots (DraftSide's KV rows)."""

    def __init__(self, draft, cfg: decoder.Settings, steps: int, *, max_prompt: int, max_new_tokens: int,
                 backend: str = "kernels", impl: str | None = None, seed: int = 0,
                 graphs: bool | None = None, growth: str = "likely"):
        graphs = set_up_draft(self, draft, cfg, steps, max_prompt=max_prompt, max_new_tokens=max_new_tokens,
                              backend=backend, impl=impl, seed=seed, graphs=graphs, growth=growth)
        slots = self.tree_rows  # a node slot per KV row of the tree
        device, vocab = draft.device, draft.config.vocab_size
        self.tree = DeviceTree(1 + slots * cfg.branch, slots, cfg.branch, cfg.mode, vocab, device,
                               kernels=backend == "kernels")
        sampling = cfg.mode == "sample"
        self.uniforms = UniformPool(cfg.tree_size + 1, vocab, self.gen, device) if sampling else None
        int32 = dict(dtype=torch.int32, device=device)
        self.moves = torch.zeros((3, slots), **int32)  # src, dst, and the count in [2, 0]
        self.compactor = self.ops.compactor(self.cache, self.moves[0:1], self.moves[1:2], self.moves[2, 0:1])
        self.reply = torch.zeros(2 + cfg.tree_size, dtype=torch.int64, device=device)  # k1, next, path
        self._graphs = graphs
        self.passes = {(w, owed): self._capture(_Pass(self, w, owed)) for w in range(1, cfg.tree_size + 1)
                       for owed in ((False, True) if w == 1 else (False,))}
        self._select = self._capture(lambda: self._chosen(cfg.tree_size))
        reply = self.reply
        reply[0] = 1  # a one-node path, for the capture's warm-up
        tree = self.tree
        self._reroot = self._capture(lambda: tree.reroot(reply[2:], reply[:1], reply[1:2], self.moves,
                                                         self.compactor))
        self.prefix, self.calls, self.sent = 0, 0, []
        self.n_rows = self.n_nodes = 0
        self.root_run = self.owed = False
        self.likely = False  # the host's mirror of tree.likely
        self.tree.likely.zero_()
        if self.uniforms is not None:
            self.uniforms.restart()  # the captures above moved the device's cursor

    def _capture(self, body):
        """body as a graph on a GPU (captured on a throwaway tree: start resets it), else itself."""
        if not self._graphs:
            return body
        from course.measure.timing import graphed

        self.tree.reset(0, 1)
        self.tree.select(1)  # a subtree sent, for the re-root's capture
        replay = graphed(body)
        replay.body = body  # the graph reads and writes the body's buffers: they must live as long
        return replay

    def children(self, rows: torch.Tensor, logits: torch.Tensor, owed: bool) -> None:
        """After the pass, in its graph: each node's candidates (greedy: the draft's top-`branch`
        tokens; sample: `branch` draws without replacement by Gumbel top-k, in draw order) into the
        tables (`DraftSide._finish`'s rule)."""
        logq = torch.log_softmax(logits.float(), -1)
        if self.cfg.mode == "greedy":
            self.tree.add_children(rows, *self.tree.best_children(logq), None)
            return
        uniforms = self.uniforms.take(rows.numel(), int(owed))
        self.tree.add_children(rows, *self.tree.best_children(logq, uniforms), logq.exp())

    # ------------------------------------------------------------------ DraftSide's interface

    def start(self, prompt: list[int], seed: int | None = None) -> None:
        """Prefill the prompt but its last token, which becomes the root of a fresh tree; seed:
        restart the side's generator (sampling) from it."""
        _fits(prompt, self.max_prompt)
        if seed is not None:
            self.gen.manual_seed(seed)
            if self.uniforms is not None:
                self.uniforms.restart()
        self.prefix, self.sent, self.calls = len(prompt) - 1, [], 0
        self.tree.reset(prompt[-1], self.prefix)
        self.n_rows, self.n_nodes, self.root_run, self.owed = 1, 0, False, False
        decoder.prefill(self.ops, self.model, self.cache, [prompt])

    def _run(self, width: int, owed: bool = False, likely: bool = False) -> None:
        """One pass of `width` nodes (the best candidates); the mirror follows its counts."""
        if self.n_nodes + width > self.tree.slots or self.n_rows + width * self.cfg.branch > self.tree.rows:
            raise ValueError(f"a pass of {width} nodes would overflow the draft tree's tables ("
                             f"{self.n_nodes} of {self.tree.slots} node slots, {self.n_rows} of "
                             f"{self.tree.rows} rows)")
        if self.uniforms is not None:
            self.uniforms.reserve(width + owed)
        if likely != self.likely:  # a fill is a kernel launch: 8-13 us of the host on a critical pass
            self.tree.likely.fill_(1.0 if likely else 0.0)
            self.likely = likely
        step = self.passes.get((width, owed)) or _Pass(self, width, owed)
        step()
        self.calls += 1
        self.n_nodes += width
        self.n_rows += width * self.cfg.branch

    def grow(self, steps: int = 0, ahead: bool = False) -> int:
        """`DraftSide.grow`: run the root if it is new, top up until tree_size items can be sent, then
        `steps` steps of `width` nodes; every pass is queued on the GPU without a wait."""
        size, branch, width = self.cfg.tree_size, self.cfg.branch, self.cfg.width
        calls = self.calls
        if not self.root_run:
            self._run(1, owed=self.owed)
            self.root_run, self.owed = True, False
        while self.n_rows - self.n_nodes > 0 and self.n_rows < size:
            self._run(min(-(-(size - self.n_rows) // branch), self.n_rows - self.n_nodes))
        likely = ahead and self.growth == "likely"
        for _ in range(min(steps, max(0, (self.max_nodes - self.n_nodes) // width))):
            if self.n_rows == self.n_nodes:
                break
            self._run(min(width, self.n_rows - self.n_nodes), likely=likely)
        return self.calls - calls

    def subtree(self) -> tuple[list[int], list[int], torch.Tensor | None]:
        """`DraftSide.subtree`: the best tree_size items, parents over the subtree's indices, tokens,
        and q (items, V) in sampling mode."""
        size = min(self.cfg.tree_size, self.n_rows)
        message, q = self._select() if size == self.cfg.tree_size else self._chosen(size)
        message = message.tolist()
        parents, tokens = message[:size], message[size:]
        self.sent = parents
        return parents, tokens, q

    def _chosen(self, size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The selection's message and, sampling, its q: one graph on a GPU for the usual size."""
        message = self.tree.select(size)
        return message, self.tree.sent_q(size) if self.cfg.mode == "sample" else None

    def reroot(self, path: list[int], next_token: int, owe: bool = False) -> bool | None:
        """`DraftSide.reroot`: commit the path, keep the subtree of the next token if the draft ran
        that child, move the KV rows. Returns True when the new root is a node the draft ran (or runs
        at once with the owed token, as DraftSide's adopt), else None. owe (the queued schedule): the
        owed token waits for the growth during the next verification, so the new root is sent unrun
        and alone, and counts as no subtree kept (`pyspec_ref.parallel_tree`'s `_owe`)."""
        sent = self.sent
        if (not path or path[0] != 0 or max(path) >= len(sent) or min(path) < 0
                or any(sent[path[i]] != path[i - 1] for i in range(1, len(path)))):
            raise ValueError(f"path {path} is not a root path of the {len(sent)}-node subtree sent last")
        if not 0 <= next_token < self.model.config.vocab_size:
            raise ValueError(f"next_token = {next_token} is not a token id of the draft's vocabulary")
        pad = [0] * (self.cfg.tree_size - len(path))
        self.reply.copy_(host_ints([len(path), next_token, *path, *pad]))
        rows, nodes, owed, found = self._reroot().tolist()
        self.rerooted(rows, nodes, owed, found, len(path))
        # As DraftSide counts it: a root the draft had already run, or ran with the owed token (adopt).
        return True if found or (owed and not owe) else None

    def rerooted(self, rows: int, nodes: int, owed: int, found: int, committed: int) -> None:
        """The host's mirror after a re-root of `committed` tokens whose counts it has read back (the
        re-root's graph returns them: [live rows, nodes, owed, kept a subtree])."""
        self.n_rows, self.n_nodes, self.owed, self.root_run = rows, nodes, bool(owed), bool(found)
        self.prefix += committed

