"""A tree speculative decoder to read in one sitting: one prompt, greedy, every step launched eagerly.

This is the capstone's idea with nothing else in the way (notebook 19 reads it before the fast
decoder of `course.capstone.decoder`). A round of tree speculative decoding (SpecInfer, Miao et al.,
2024; SwiftSpec's tree growth, §3.1-3.2) is three steps:

1. draft: the small model grows a tree of guesses after the last committed token (the root), each
   step running the `width` most probable nodes not yet run and giving each its `branch` best
   next tokens as children;
2. verify: the target runs the `tree_size` most probable nodes in ONE pass, each seeing the prefix
   and its own ancestors, and the greedy walk keeps the longest path of tokens that are the
   target's argmax, plus the target's own next token;
3. commit: the accepted path's keys and values move to the end of the prefix in both caches.

The bookkeeping is plain Python lists (one prompt: a few numbers per round); the attention, the
verification and the moves are the course's kernels, the same ones the fast decoder runs, loaded
from `lessons/` or `solutions/` (`course.core.impl`):

* `emssd.unpadded_attention` (notebook 17): causal attention of new tokens over a cache, for the
  prompt and for the tokens the draft has not seen yet;
* `swiftspec.tree_cache_attention` (notebook 18): the draft's steps and the target's pass over
  [prefix | tree], each query seeing its ancestors by the DFS-interval test of notebook 01;
* `tree_verification.greedy_tree_verification` (notebook 16): the accepted path and next token;
* `swiftspec.compact` (notebook 18): the accepted rows' moves, in place.

Cache layout: rows [0, P) of each cache hold the committed tokens before the root; during a round,
row P + i of the draft's cache holds node i of the tree (the root is node 0, at row P), and row
P + j of the target's the j-th node it verifies.

Its `Tree` is the course's draft-tree model to read first; `course.capstone.tree`'s docstring says
why each of the others exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from course.core import impl as course_impl
from pyspec_ref.trees import dfs_times

from .model import KVCache, TinyLM


@dataclass(frozen=True)
class Kernels:
    """The student's modules whose public launchers the decoder calls."""

    emssd: object
    swiftspec: object
    verification: object


def load_kernels(impl: str | None = None) -> Kernels:
    """lessons/ by default, solutions/ with COURSE_IMPL=solutions or impl="solutions"."""
    return Kernels(course_impl.load("emssd", impl), course_impl.load("swiftspec", impl),
                   course_impl.load("tree_verification", impl))


def int32(values: list[int], device) -> torch.Tensor:
    """One row of int32 (shape (1, n)): the kernels' batch of one."""
    return torch.tensor([values], dtype=torch.int32, device=device)


# --------------------------------------------------------------------------- the two attentions


def causal_attention(kernels: Kernels, start: int, count: int):
    """`attend` for `count` new tokens at cache rows [start, start + count): token i sees rows
    [0, start + i]. EMS-SD's kernel takes a flat cache (rows, KV heads, d) in which each sample owns
    a run of rows. In the model's cache (1, KV heads, rows, d) each KV head's rows are one such run,
    so every KV head becomes one EMS-SD sample with one KV head, its queries the `group` query heads
    that read it (a view of the cache; q and the output are regrouped)."""
    def attend(layer, q, k, v):
        _, heads, width, d = q.shape
        heads_kv, slots = k.shape[1], k.shape[2]
        group = heads // heads_kv
        queries = q[0].reshape(heads_kv, group, width, d).transpose(1, 2).reshape(-1, group, d).contiguous()
        out = kernels.emssd.unpadded_attention(queries, k[0].reshape(-1, 1, d), v[0].reshape(-1, 1, d),
                                               [count] * heads_kv, [h * slots for h in range(heads_kv)],
                                               [start] * heads_kv)
        return out.view(heads_kv, width, group, d).transpose(1, 2).reshape(1, heads, width, d)
    return attend


def tree_attention(kernels: Kernels, cache: KVCache, prefix: int, parents: list[int], queries: list[int]):
    """`attend` for the tree nodes `queries` (ids into `parents`), node i at cache row prefix + i: a
    query sees the whole prefix and the tree rows of its ancestors and itself. The ancestor test is
    the interval test of DFS times (start[j] <= start[i] and end[i] <= end[j], notebook 01), so the
    times of the whole tree are computed again for each step: the tree grew since the last one."""
    device = cache.data.device
    start, end = dfs_times(parents)
    kv_start = torch.zeros((1, cache.data.shape[2]), dtype=torch.int32, device=device)
    kv_end = torch.zeros_like(kv_start)
    kv_start[0, prefix:prefix + len(parents)] = torch.tensor(start, dtype=torch.int32)
    kv_end[0, prefix:prefix + len(parents)] = torch.tensor(end, dtype=torch.int32)
    q_start, q_end = int32([start[i] for i in queries], device), int32([end[i] for i in queries], device)
    lengths = int32([prefix], device)[0], int32([len(parents)], device)[0]  # the prefix's and the tree's

    def attend(layer, q, k, v):
        return kernels.swiftspec.tree_cache_attention(q, k, v, q_start, q_end, kv_start, kv_end, *lengths)
    return attend


def run(model: TinyLM, cache: KVCache, tokens: list[int], positions: list[int], rows: list[int], attend):
    """One model pass over new tokens (their keys and values written at `rows`): logits (n, V)."""
    tokens, positions, rows = (torch.tensor([x], dtype=torch.int64, device=model.device)
                               for x in (tokens, positions, rows))
    return model.step(tokens, positions, cache, rows, attend)[0]


def extend(kernels: Kernels, model: TinyLM, cache: KVCache, sequence: list[int], first: int) -> torch.Tensor:
    """Feed sequence[first:] causally at rows first.. (the cache already holds rows [0, first)):
    the prompt at the start, and each round the tokens the draft has not seen. Logits (n, V)."""
    count = len(sequence) - first
    where = list(range(first, len(sequence)))
    return run(model, cache, sequence[first:], where, where, causal_attention(kernels, first, count))


# --------------------------------------------------------------------------- the draft tree


@dataclass
class Tree:
    """A round's draft tree: node 0 is the root; a node's score is its cumulative draft
    log-probability (SwiftSpec's maximum-likelihood growth)."""

    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    scores: list[float] = field(default_factory=lambda: [0.0])
    ran: list[bool] = field(default_factory=lambda: [False])

    def rank(self, node: int) -> tuple:
        """Best first: higher score, then shallower, then older. A child never scores above its
        parent (log-probabilities are <= 0) and is deeper, so the best n nodes are always a subtree
        holding the root."""
        return -self.scores[node], self.depths[node], node

    def best(self, n: int, among: list[int]) -> list[int]:
        return sorted(sorted(among, key=self.rank)[:n])

    def grow(self, node: int, logits: torch.Tensor, branch: int) -> None:
        """Give `node` its `branch` most probable next tokens (from the draft's logits there)."""
        self.ran[node] = True
        logp, tokens = torch.log_softmax(logits.float(), dim=-1).topk(branch)
        for lp, token in zip(logp.tolist(), tokens.tolist(), strict=True):
            self.tokens.append(token)
            self.parents.append(node)
            self.depths.append(self.depths[node] + 1)
            self.scores.append(self.scores[node] + lp)
            self.ran.append(False)


def draft_tree(kernels, draft, cache, sequence, seen: int, steps: int, width: int, branch: int):
    """Grow a round's tree. The draft first runs, causally, the committed tokens it has not seen
    (rows [seen, P)) and the root (row P); then each later step runs the `width` best nodes not yet
    run, as queries against [prefix | tree]. Returns the tree."""
    prefix = len(sequence) - 1
    tree = Tree(tokens=[sequence[-1]])
    tree.grow(0, extend(kernels, draft, cache, sequence, seen)[-1], branch)
    for _ in range(steps - 1):
        nodes = tree.best(width, [i for i, ran in enumerate(tree.ran) if not ran])
        attend = tree_attention(kernels, cache, prefix, tree.parents, nodes)
        logits = run(draft, cache, [tree.tokens[i] for i in nodes], [prefix + tree.depths[i] for i in nodes],
                     [prefix + i for i in nodes], attend)
        for node, node_logits in zip(nodes, logits, strict=True):
            tree.grow(node, node_logits, branch)
    return tree


# --------------------------------------------------------------------------- verification and commit


def verify(kernels, target, cache, tree: Tree, prefix: int, tree_size: int):
    """The target's one pass over the `tree_size` best nodes (their rows prefix + j, in id order),
    then the greedy walk. Returns the chosen node ids, the accepted path (indices into them) and
    the target's next token."""
    chosen = tree.best(tree_size, list(range(len(tree.tokens))))
    local = {node: j for j, node in enumerate(chosen)}
    parents = [local.get(tree.parents[node], -1) for node in chosen]
    tokens = [tree.tokens[node] for node in chosen]
    rows = [prefix + j for j in range(len(chosen))]
    attend = tree_attention(kernels, cache, prefix, parents, list(range(len(chosen))))
    logits = run(target, cache, tokens, [prefix + tree.depths[node] for node in chosen], rows, attend)
    device = target.device
    path, next_token = kernels.verification.greedy_tree_verification(int32(parents, device),
                                                                     int32(tokens, device), logits[None])
    return chosen, [j for j in path[0].tolist() if j >= 0], int(next_token[0])


def move_rows(kernels, cache: KVCache, prefix: int, sources: list[int]) -> None:
    """Row prefix + sources[j] becomes row prefix + j (SwiftSpec's compaction; a row already in
    place does not move)."""
    moves = [(prefix + s, prefix + j) for j, s in enumerate(sources) if s != j]
    if moves:
        device = cache.data.device
        src, dst = int32([s for s, _ in moves], device), int32([d for _, d in moves], device)
        kernels.swiftspec.compact(cache.data, src, dst, torch.tensor([len(moves)], device=device))


def check_request(prompt, **counts) -> None:
    """A non-empty list of token ids and positive ints; the error names the argument."""
    if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
        raise ValueError(f"prompt must be a non-empty list of token ids, got {prompt!r}")
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass
class Result:
    """What `generate` returns."""

    tokens: list[int]  # the new tokens (the prompt not repeated)
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted in each round


@torch.no_grad()
def generate(target: TinyLM, draft: TinyLM, prompt: list[int], max_new_tokens: int, *, tree_size: int = 8,
             width: int = 2, branch: int = 4, steps: int = 3, impl: str | None = None) -> Result:
    """Greedy tree speculative decoding of one prompt (token ids): the target's own greedy output."""
    check_request(prompt, max_new_tokens=max_new_tokens, tree_size=tree_size, width=width, branch=branch,
                  steps=steps)
    kernels = load_kernels(impl)
    tree_nodes = 1 + branch * (1 + width * (steps - 1))  # the most a round's tree can hold
    rows = len(prompt) + max_new_tokens + tree_nodes
    target_cache, draft_cache = target.new_cache(1, rows), draft.new_cache(1, rows)
    sequence = list(prompt)
    if len(sequence) > 1:  # the prompt but its last token, into the target's cache
        extend(kernels, target, target_cache, sequence[:-1], 0)
    seen, result = 0, Result([])  # rows of the draft's cache that hold committed tokens
    while len(result.tokens) < max_new_tokens:
        prefix = len(sequence) - 1
        tree = draft_tree(kernels, draft, draft_cache, sequence, seen, steps, width, branch)
        chosen, path, next_token = verify(kernels, target, target_cache, tree, prefix, tree_size)
        move_rows(kernels, target_cache, prefix, path)
        ran = [chosen[j] for j in path if tree.ran[chosen[j]]]  # the path's nodes the draft ran
        move_rows(kernels, draft_cache, prefix, ran)
        seen = prefix + len(ran)
        new = [tree.tokens[chosen[j]] for j in path[1:]] + [next_token]
        sequence += new
        result.tokens += new
        result.accepted.append(len(path) - 1)
    del result.tokens[max_new_tokens:]
    return result


@torch.no_grad()
def plain_greedy(target: TinyLM, prompt: list[int], max_new_tokens: int, *,
                 impl: str | None = None) -> list[int]:
    """Plain greedy decoding with the same causal kernel: one target pass per token (the baseline)."""
    check_request(prompt, max_new_tokens=max_new_tokens)
    kernels = load_kernels(impl)
    cache = target.new_cache(1, len(prompt) + max_new_tokens)
    sequence, first = list(prompt), 0
    while len(sequence) < len(prompt) + max_new_tokens:
        logits = extend(kernels, target, cache, sequence, first)
        first = len(sequence)
        sequence.append(int(logits[-1].argmax()))
    return sequence[len(prompt):]
