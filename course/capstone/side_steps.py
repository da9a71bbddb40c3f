"""The model passes of notebook 20's two sides with static shapes, so that a GPU replays each as one
CUDA graph (`course.capstone.sides` runs them).

A tree-attention pass of a few queries over a small model is a few hundred tiny kernels, and
launching them from Python costs more than running them: the serial decoder (`decoder`'s docstring)
measured an eager step at ten times its graphed time. The parallel draft cannot use the decoder's
fixed round shape (its tree outlives a round and has any shape), but each of its passes has a fixed
SHAPE once its number of queries is fixed. So each side keeps one `TreeStep` per query count: fixed
device buffers for its inputs, the model step and what follows it (top-k, sampling, verification,
compaction), captured as a CUDA graph before the side's first prefill and replayed afterwards.

What changes from pass to pass is small and lives on the host: the committed prefix P, the tree's
DFS times (FlashSpecInfer §5.1; every new node renumbers them), the queries' tokens, depths and tree
rows. The host writes them into ONE int64 vector (`pack`) and copies it to the GPU in one transfer;
the graph unpacks it there (positions = P + depth, cache rows = P + node, the times scattered into
the cache's rows P .. P + T - 1). One copy in, one graph launch, one copy of the results out.
"""

from __future__ import annotations

import array
from collections.abc import Callable, Sequence

import torch

from .backends import TreeIndex

HEAD = 2  # the packed vector starts with the prefix P and the tree's length T
_TYPECODES = {torch.int64: "q", torch.int32: "i"}


def host_ints(values: Sequence[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A CPU tensor of Python ints, built through an `array` (C ints already, which torch wraps
    without a copy): torch.tensor reads a list one Python object at a time, three times slower for
    the few hundred ints of a pass, and the target's pass waits for them every round."""
    return torch.frombuffer(array.array(_TYPECODES[dtype], values), dtype=dtype)


class UniformPool:
    """The Gumbel uniforms of many draft passes, drawn on the host in one go and copied to the GPU in
    one transfer; each pass's graph takes its rows at a cursor on the device and moves it on.

    Drawing a pass's few rows and copying them over costs the host about 50 us of CUDA calls (an
    event, a copy), more than the pass's own launch: on the critical path, a sampling pass would
    cost the host five times a greedy one. The host's generator yields the same numbers whether it
    is asked for many rows at once or a few at a time, so drawing ahead leaves every pass with the
    rows `sides.DraftSide` draws for it. `reserve(n)` (on the host, before launching a pass of n
    rows) refills the pool when it is short: the rows drawn but not yet taken move to its front and
    fresh ones fill the rest; the copy is queued after every pass launched before it, so none of
    them reads a row it did not draw. BYTES bounds the pool (at least one pass of the largest size);
    `rows`, when given, sets it (a pool of short rows, the target's, needs far fewer than BYTES holds)."""

    BYTES = 1 << 22

    def __init__(self, most: int, vocab_size: int, generator: torch.Generator, device,
                 rows: int | None = None):
        on_gpu = torch.device(device).type == "cuda"
        self.rows = max(most, rows if rows is not None else self.BYTES // (8 * vocab_size))
        self.gen = generator
        self.host = torch.zeros((self.rows, vocab_size), dtype=torch.float64, pin_memory=on_gpu)
        self.pool = torch.zeros((self.rows, vocab_size), dtype=torch.float64, device=device)
        self.cursor = torch.zeros((), dtype=torch.int64, device=device)
        self.steps = torch.arange(most, device=device)
        self.copied = torch.cuda.Event() if on_gpu else None
        self.reserved = self.rows

    def restart(self) -> None:
        """After the generator was seeded again: every row drawn anew."""
        self.reserved = self.rows
        self._refill()

    def reserve(self, n: int) -> None:
        """Before launching a pass that takes n rows: refill first if fewer than n are left."""
        if self.reserved + n > self.rows:
            self._refill()
        self.reserved += n

    def _refill(self) -> None:
        if self.copied is not None:
            self.copied.synchronize()  # the last refill's copy has read the host buffer
        left = self.rows - self.reserved
        self.host[:left] = self.host[self.reserved:].clone()
        torch.rand(self.host[left:].shape, generator=self.gen, dtype=torch.float64, out=self.host[left:])
        self.pool.copy_(self.host, non_blocking=self.copied is not None)
        self.cursor.zero_()
        if self.copied is not None:
            self.copied.record()
        self.reserved = 0

    def take(self, n: int, skip: int = 0) -> torch.Tensor:
        """In a pass's graph: the next n rows, past `skip` rows drawn and left unused (the owed
        token's: `sides.DraftSide` draws one for it too); the cursor moves past all of them."""
        # Modulo the pool: `reserve` refills before a pass could run past its end, but a graph's
        # capture runs its body with no reservation.
        rows = (self.cursor + self.steps[:skip + n]) % self.rows
        self.cursor.add_(skip + n)
        return self.pool[rows[skip:]]  # indexing, not index_select: see `TinyLM.step`


class TreeStep:
    """One tree-attention pass of exactly `width` queries over a [prefix | tree] cache whose tree has
    at most `tree_rows` rows (`swiftspec.tree_cache_attention`, notebook 18), then `finish`.

    finish(logits (width, V) in the model's dtype, prefix (1,), extra: int64 on the device) runs in
    the same graph and returns the tensors the host reads. `extra` is the tail of the packed vector,
    for finishes that need more per-pass integers (the target's parents and tokens); the `extra`
    given here are its first contents, valid ones, since a capture's warm-up runs on them. graphs:
    capture now (on the packed vector's first contents: a chain tree at P = 0, so build a side's
    steps before its first prefill)."""

    def __init__(self, ops, model, cache, width: int, tree_rows: int,
                 finish: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object], *,
                 extra: Sequence[int] = (), graphs: bool = False):
        device = cache.data.device
        self.width, self.tree_rows, self.extra = width, tree_rows, len(extra)
        self.model, self.cache, self.finish = model, cache, finish
        size = HEAD + 5 * width + 2 * tree_rows + len(extra)
        self.packed = torch.zeros(size, dtype=torch.int64, device=device)
        int32 = dict(dtype=torch.int32, device=device)
        rows = cache.capacity + 1
        # Valid one-node contents for the launcher's checks, which read the buffers once (now).
        self.index = TreeIndex(torch.zeros((1, width), **int32), torch.zeros((1, width), **int32),
                               torch.zeros((1, rows), **int32), torch.zeros((1, rows), **int32),
                               torch.zeros(1, **int32), torch.ones(1, **int32),
                               torch.full((1,), width, **int32))
        self.workspace = model.workspace(1, width)
        self.attend = ops.tree_attention(model, cache, self.workspace, self.index)
        self.columns = torch.arange(tree_rows, device=device)
        chain = list(range(width))
        self.load(0, (chain, [width - 1] * width), chain, [0] * width, chain, extra)
        self.run = self._body
        if graphs:
            from course.measure.timing import graphed

            self.run = graphed(self._body)

    def load(self, prefix: int, times: tuple[list[int], list[int]], nodes: Sequence[int],
             tokens: Sequence[int], depths: Sequence[int], extra: Sequence[int] = ()) -> None:
        """One pass's inputs in one copy: the prefix P, the whole tree's DFS times (T rows), and the
        queries: tree rows `nodes` with their tokens and depths; `extra` fills the finish's tail."""
        start, end = times
        pad = [0] * (self.tree_rows - len(start))
        values = [prefix, len(start), *tokens, *depths, *nodes, *(start[v] for v in nodes),
                  *(end[v] for v in nodes), *start, *pad, *end, *pad, *extra]
        if len(values) != self.packed.numel():
            raise ValueError(f"a pass of {len(nodes)} queries over {len(start)} tree rows with {len(extra)} "
                             f"extra values does not fit this step ({self.width} queries, at most "
                             f"{self.tree_rows} rows, {self.extra} extra values)")
        self.packed.copy_(host_ints(values))

    def _body(self):
        """The pass itself: unpack on the device, the model step, the finish (no host waits)."""
        p, W, T = self.packed, self.width, self.tree_rows
        prefix, tree_len = p[0:1], p[1:2]
        tokens, depths, nodes = p[HEAD:HEAD + W], p[HEAD + W:HEAD + 2 * W], p[HEAD + 2 * W:HEAD + 3 * W]
        at = HEAD + 3 * W
        self.index.q_start[0].copy_(p[at:at + W])
        self.index.q_end[0].copy_(p[at + W:at + 2 * W])
        at += 2 * W
        # The tree's row times go to cache rows P .. P + T - 1; the padding past T to the scratch row's
        # column, which no query reads.
        columns = torch.where(self.columns < tree_len, prefix + self.columns, self.cache.scratch_row)
        self.index.kv_start[0].scatter_(0, columns, p[at:at + T].to(torch.int32))
        self.index.kv_end[0].scatter_(0, columns, p[at + T:at + 2 * T].to(torch.int32))
        self.index.prefix.copy_(prefix)
        self.index.tree_len.copy_(tree_len)
        logits = self.model.step(tokens[None], (prefix + depths)[None], self.cache, (prefix + nodes)[None],
                                 self.attend, workspace=self.workspace, validate=False, padding=False,
                                 float_logits=False)
        return self.finish(logits[0], prefix, p[at + 2 * T:])


class Steps:
    """A side's TreeSteps by query count: those named at construction are built (and, on a GPU,
    captured) then; any other count is built when first needed and runs uncaptured (a capture's
    warm-up would run the pass on live data, and the target's pass moves cache rows)."""

    def __init__(self, make: Callable[[int, bool], TreeStep], widths: Sequence[int], graphs: bool):
        self.make = make
        self.built = {w: make(w, graphs) for w in sorted(set(widths))}

    def __getitem__(self, width: int) -> TreeStep:
        if width not in self.built:
            self.built[width] = self.make(width, False)
        return self.built[width]


class MoveBuffers:
    """SwiftSpec's compaction (`swiftspec.compact`, notebook 18) of one cache with fixed buffers:
    up to `most` moves, written by the host in one copy, then one prepared launch."""

    def __init__(self, ops, cache, most: int):
        device = cache.data.device
        self.most = most
        self.values = torch.zeros(1 + 2 * most, dtype=torch.int32, device=device)  # count, src..., dst...
        counts, src, dst = self.values[0:1], self.values[1:1 + most], self.values[1 + most:]
        self.launch = ops.compactor(cache, src[None], dst[None], counts)

    def __call__(self, moves: list[tuple[int, int]]) -> None:
        """Move cache rows src -> dst for each (src, dst): dst increasing, dst <= src."""
        if not moves:
            return
        if len(moves) > self.most:
            raise ValueError(f"{len(moves)} moves; these buffers hold at most {self.most}")
        pad = [0] * (self.most - len(moves))
        values = [len(moves), *(s for s, _ in moves), *pad, *(d for _, d in moves), *pad]
        self.values.copy_(host_ints(values, torch.int32))
        self.launch()
