"""Tree-structured decoding workloads for DeFT (notebooks 13-14 and `course.topics.deft.bench`).

A workload is one decoding step over a KV tree (the data model of `pyspec_ref.deft`):
nodes 0..M-1 with `parents` (parent numbered before child, node 0 the root) and
`lengths` (tokens per node), and `query_nodes`: query i is the next token after the
last token of node query_nodes[i], whose own KV is already that node's last token, so it
sees every token of every node on its root path. The tokens are laid out flattened, nodes
in DFS preorder (`token_offsets`), as DeFT-Flatten (Yao et al., §3.3) stores them.

The families follow the three workloads of DeFT's evaluation (Yao et al., §4 and Table 4).
They are generated here from a seed, not recorded from a model: what a tree-attention
kernel's cost depends on is the tree's shape (how much KV is shared, by how many queries,
how uneven the nodes are), and these generators reproduce those shapes.

Few-shot prompting, `few_shot(b, prompt=4096, generated=256)`
    A 4k-token prompt (the few-shot examples plus the question) is node 0; b = 20, 30 or
    50 answers are sampled from it, each a branch decoded in lockstep. At decoding step g
    every branch holds g tokens, so the tree is a star: M = b + 1 nodes,
    T = prompt + b * g tokens, Q = b queries (one per branch). The prompt is shared by
    every query: a sequence-based kernel reads it b times. The bench measures g = 256
    (DeFT decodes a few hundred tokens per branch; 256 is a step in the middle).
Multi-step reasoning, `reasoning(width=10, levels=4, prompt=1024)`
    Tree-of-thoughts-like search (DeFT §4 uses trees of Besta et al.'s Graph-of-Thoughts
    tasks such as sorting and document merging): a prompt, then `levels` rounds of
    thoughts. Round 1 proposes `width` thoughts; each later round keeps the `keep` = 3
    best thoughts of the round before and proposes `width` new thoughts spread over the
    kept ones (each kept thought gets at least one). Pruned thoughts, and thoughts left
    with no live descendant, have their KV freed: the tree is the union of the root paths
    of the thoughts being decoded. Thoughts are of uneven length, drawn log-uniformly from
    [min_len, max_len] = [32, 512] tokens. The queries are the `width` thoughts of the last
    round. M <= 1 + keep*(levels-1) + width nodes (at most 20 with the defaults), every
    leaf a query at depth `levels`; T between 1024 + 13*32 = 1440 and 1024 + 19*512 =
    10752 tokens, Q = width = 10. Uneven nodes are where DeFT-Node's
    one-group-per-node partition is unbalanced and DeFT-Flatten's even blocks are not
    (DeFT Figure 5).
Speculative decoding, `speculative(P, t)`
    A verified prefix of P tokens (P = 4096 or 16384) is node 0; a draft model proposed a
    token tree of t = 32, 64, 128 or 256 one-token nodes below it, to be verified in one
    step. The tree has the shape of the ladder's benchmark trees (FlashSpecInfer §6,
    `course.core.inputs.random_tree`: grown breadth first, every node 1..10 children), the
    prefix node at its root. Every token-tree node is a query: M = t + 1 nodes,
    T = P + t tokens, Q = t. Here the shared part is almost all of the KV and the queries
    are many: the case where re-reading the prefix per query (sequence-based) or per
    query block (dense mask) costs most.
Tiny variants, `tiny()`
    One small tree per family (a few dozen tokens) for Triton's interpreter and CI.
Edge cases, `edge_cases(block_tokens)`
    A single node, a single token, a chain of nodes, one-token nodes queried everywhere
    (internal nodes too), a node that crosses a block boundary and one longer than a
    block, more than 128 queries seeing one block (three 64-bit mask words), one query
    in a bushy tree (most nodes unseen), queries listed out of DFS order, a deep chain.

The attention shape of the measurements is Llama-3-8B's: 32 query heads, 8 KV heads,
d = 128, fp16 (`LLAMA3_8B`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pyspec_ref
from course.core import inputs

# Llama-3-8B's attention (grouped-query: 4 query heads per KV head), as measured.
LLAMA3_8B = {"heads_q": 32, "heads_kv": 8, "d": 128, "dtype": "float16"}
FAMILIES = ("few_shot", "reasoning", "speculative", "edge")

FEW_SHOT_PROMPT = 4096
FEW_SHOT_BRANCHES = (20, 30, 50)
FEW_SHOT_GENERATED = 256  # the growth step the bench measures
SPECULATIVE_PREFIXES = (4096, 16384)
SPECULATIVE_TREES = (32, 64, 128, 256)
SEED = 2024


@dataclass(frozen=True)
class Workload:
    """One decoding step over a KV tree: the tree, its node lengths and the query nodes."""

    name: str
    family: str
    parents: tuple[int, ...]
    lengths: tuple[int, ...]
    query_nodes: tuple[int, ...]
    description: str = ""
    params: dict = field(default_factory=dict, compare=False, hash=False)  # generator arguments

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        parents = pyspec_ref.validate_topological(list(self.parents), "parents")
        lengths = [_positive(x, f"lengths[{i}]") for i, x in enumerate(_as_list(self.lengths, "lengths"))]
        if len(lengths) != len(parents):
            raise ValueError(f"lengths has {len(lengths)} entries, expected one per node ({len(parents)})")
        queries = _as_list(self.query_nodes, "query_nodes")
        if not queries:
            raise ValueError("query_nodes must hold at least one query")
        for i, node in enumerate(queries):
            if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < len(parents):
                raise ValueError(f"query_nodes[{i}] = {node!r} is not a node id in 0..{len(parents) - 1}")
        object.__setattr__(self, "parents", tuple(parents))
        object.__setattr__(self, "lengths", tuple(lengths))
        object.__setattr__(self, "query_nodes", tuple(queries))
        object.__setattr__(self, "params", dict(self.params))

    @property
    def nodes(self) -> int:
        """M, the number of nodes."""
        return len(self.parents)

    @property
    def tokens(self) -> int:
        """T, the number of tokens in the KV tree."""
        return sum(self.lengths)

    @property
    def queries(self) -> int:
        """Q, the number of queries decoded in this step."""
        return len(self.query_nodes)

    def path_tokens(self) -> list[int]:
        """How many tokens each query sees (the lengths of the nodes on its root path)."""
        seen = []
        for node in self.query_nodes:
            total = 0
            while node != -1:
                total += self.lengths[node]
                node = self.parents[node]
            seen.append(total)
        return seen

    def summary(self) -> str:
        """One line: sizes and how much the queries share."""
        paths = sum(self.path_tokens())
        return (f"{self.name}: M={self.nodes} nodes, T={self.tokens} tokens, Q={self.queries} queries; "
                f"the queries' root paths hold {paths} tokens, {paths / self.tokens:.1f}x the tree")


def _as_list(value, name: str) -> list:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a sequence of ints, got {type(value).__name__}")
    return list(value)


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


# --------------------------------------------------------------------------- families


def few_shot(b: int, prompt: int = FEW_SHOT_PROMPT, generated: int = FEW_SHOT_GENERATED) -> Workload:
    """Few-shot prompting (DeFT §4): a prompt node with b branches of `generated` tokens each."""
    b, prompt, generated = (_positive(x, n) for x, n in ((b, "b"), (prompt, "prompt"),
                                                           (generated, "generated")))
    return Workload(
        f"few-shot b={b} prompt={prompt} g={generated}", "few_shot", tuple([-1] + [0] * b),
        tuple([prompt] + [generated] * b), tuple(range(1, b + 1)),
        f"a {prompt}-token prompt shared by {b} branches decoded in lockstep, at step {generated}",
        {"b": b, "prompt": prompt, "generated": generated})


def reasoning(width: int = 10, levels: int = 4, prompt: int = 1024, min_len: int = 32, max_len: int = 512,
              keep: int = 3, seed: int = SEED) -> Workload:
    """Multi-step reasoning (DeFT §4, tree-of-thoughts-like): see the module docstring."""
    width, levels, prompt, min_len, max_len, keep = (
        _positive(x, n) for x, n in ((width, "width"), (levels, "levels"), (prompt, "prompt"),
                                     (min_len, "min_len"), (max_len, "max_len"), (keep, "keep")))
    if max_len < min_len:
        raise ValueError(f"max_len must be >= min_len = {min_len}, got {max_len}")
    if keep > width:
        raise ValueError(f"keep must be at most width = {width}, got {keep}")
    rng = random.Random(seed)

    def length() -> int:  # log-uniform: many short thoughts, a few long ones
        return min(max_len, int(math.exp(rng.uniform(math.log(min_len), math.log(max_len + 1)))))

    parents, lengths = [-1], [prompt]
    frontier = [0]
    for level in range(levels):
        # The `keep` best thoughts of the last round each get one new thought, the rest are spread
        # over them at random; the other thoughts of the last round are pruned.
        kept = frontier if level == 0 else sorted(rng.sample(frontier, keep))
        owners = kept + [rng.choice(kept) for _ in range(width - len(kept))]
        frontier = []
        for owner in sorted(owners):
            parents.append(owner)
            lengths.append(length())
            frontier.append(len(parents) - 1)
    # A pruned thought's KV is freed, and so is every thought left without a live descendant:
    # the tree holds exactly the root paths of the thoughts being decoded.
    live = set()
    for node in frontier:
        while node != -1 and node not in live:
            live.add(node)
            node = parents[node]
    renumber = {old: new for new, old in enumerate(sorted(live))}
    frontier = [renumber[node] for node in frontier]
    parents = [-1 if parents[old] == -1 else renumber[parents[old]] for old in sorted(live)]
    lengths = [lengths[old] for old in sorted(live)]
    return Workload(
        f"reasoning width={width} levels={levels} seed={seed}", "reasoning", tuple(parents),
        tuple(lengths), tuple(frontier),
        f"tree-of-thoughts: a {prompt}-token prompt, {levels} rounds of {width} thoughts, "
        f"the {keep} best kept each round, thoughts of {min_len}-{max_len} tokens",
        {"width": width, "levels": levels, "prompt": prompt, "min_len": min_len, "max_len": max_len,
         "keep": keep, "seed": seed})


def speculative(P: int, t: int, seed: int = SEED, max_children: int = 10) -> Workload:
    """Speculative decoding (DeFT §4): a P-token prefix node and a token tree of t one-token nodes.

    The token tree is `course.core.inputs.random_tree` (the ladder's benchmark trees, FlashSpecInfer §6)
    with the prefix node as its root; every token-tree node is a query.
    """
    P, t, max_children = (_positive(x, n) for x, n in ((P, "P"), (t, "t"), (max_children, "max_children")))
    parents = inputs.random_tree(t + 1, random.Random(seed), max_children=max_children, order="bfs")
    return Workload(
        f"speculative P={P} t={t}", "speculative", tuple(parents), tuple([P] + [1] * t),
        tuple(range(1, t + 1)),
        f"a {P}-token prefix and a draft token tree of {t} tokens (fan-out 1..{max_children}), "
        "every draft token a query",
        {"P": P, "t": t, "seed": seed, "max_children": max_children})


def benchmark() -> list[Workload]:
    """The workloads `course.topics.deft.bench` measures (the course's list), in a fixed order."""
    found = [speculative(P, t) for P in SPECULATIVE_PREFIXES for t in SPECULATIVE_TREES]
    found += [few_shot(b) for b in FEW_SHOT_BRANCHES]
    found.append(reasoning())
    return found


def tiny() -> list[Workload]:
    """One small workload per family, for Triton's interpreter and CPU tests (tens of tokens)."""
    found = [
        few_shot(3, prompt=24, generated=5),
        reasoning(width=3, levels=3, prompt=16, min_len=2, max_len=12, keep=2, seed=7),
        speculative(40, 12, seed=7, max_children=3),
    ]
    return [_renamed(w, "tiny " + w.name) for w in found]


def _renamed(workload: Workload, name: str, family: str | None = None, description: str | None = None):
    return Workload(name, family or workload.family, workload.parents, workload.lengths,
                    workload.query_nodes, workload.description if description is None else description,
                    workload.params)


def edge_cases(block_tokens: int = 16) -> list[Workload]:
    """Trees where a DeFT kernel goes wrong, sized against a KV block of `block_tokens` tokens."""
    _positive(block_tokens, "block_tokens")
    if block_tokens < 4:
        raise ValueError(f"block_tokens must be at least 4, got {block_tokens}")
    bt = block_tokens
    rng = random.Random(SEED)
    one_token = inputs.random_tree(20, rng, max_children=3)
    bushy = [-1, 0, 0, 0, 1, 1, 2, 3, 3, 3]
    cases = [
        ("single node", [-1], [5], [0], "the root alone, queried"),
        ("single token", [-1], [1], [0], "T = 1"),
        ("chain of nodes", [-1, 0, 1, 2, 3], [3, 1, 4, 1, 5], [4], "one branch cut into nodes"),
        ("one-token nodes, every node queried", one_token, [1] * 20, list(range(20)),
         "internal nodes are queries too"),
        ("node across a block boundary", [-1, 0, 1, 0],
         [bt - 3, 7, 2 * bt + 5, 3], [2, 3],
         f"node 1 crosses token {bt}; node 2 is longer than two blocks"),
        ("more than 128 queries see one block", [-1] + [0] * 130, [5] + [1] * 130, list(range(1, 131)),
         "130 queries see the first block: three 64-bit mask words"),
        ("one query in a bushy tree", bushy, [4, 3, 6, 2, 5, 1, 3, 2, 2, 7], [8],
         "most nodes are seen by no query"),
        ("queries out of DFS order", bushy, [4, 3, 6, 2, 5, 1, 3, 2, 2, 7], [9, 4, 1, 8, 6, 0],
         "reversed-ish order, internal nodes and the root among them"),
        ("deep chain of one-token nodes", pyspec_ref.chain_parents(40), [1] * 40, [39, 20, 5],
         "depth 40"),
    ]
    return [Workload(f"edge: {name}", "edge", tuple(parents), tuple(lengths), tuple(queries), why,
                     {"block_tokens": bt})
            for name, parents, lengths, queries, why in cases]


# --------------------------------------------------------------------------- layout and tensors


def _deft():
    """pyspec_ref.deft, imported when first needed."""
    try:
        from pyspec_ref import deft
    except ImportError as error:
        raise NotImplementedError(
            "pyspec_ref.deft (the DeFT specification: token_offsets, visible_tokens, io_bytes) is not "
            f"available: {error}") from error
    return deft


def token_offsets(workload: Workload) -> list[int]:
    """Each node's first token in the flattened DFS layout (`pyspec_ref.deft.token_offsets`)."""
    return _deft().token_offsets(list(workload.parents), list(workload.lengths))


def query_tokens(workload: Workload) -> list[int]:
    """The flattened index of each query's own token: the last token of its node."""
    offsets = token_offsets(workload)
    return [offsets[node] + workload.lengths[node] - 1 for node in workload.query_nodes]


def _require_dims(**sizes) -> None:
    for name, size in sizes.items():
        _positive(size, name)


def kv_tensors(workload: Workload, heads_kv: int, d: int, dtype=None, device=None, seed: int = 0):
    """Random k, v of shape (T, heads_kv, d) in the flattened layout (never zeros)."""
    _require_dims(heads_kv=heads_kv, d=d)
    shape = (workload.tokens, heads_kv, d)
    return tuple(inputs.random_tensor(shape, seed + j, dtype, device) for j in (1, 2))


def query_tensor(workload: Workload, heads_q: int, d: int, dtype=None, device=None, seed: int = 0):
    """Random queries of shape (Q, heads_q, d)."""
    _require_dims(heads_q=heads_q, d=d)
    return inputs.random_tensor((workload.queries, heads_q, d), seed, dtype, device)


def paged(k, v, seed: int = 0, extra: int | None = None):
    """(cache_k, cache_v, slots): k, v scattered into a larger cache by a random permutation.

    The cache has S = T + extra slots (extra = max(1, T // 4) by default); flattened token j
    lives in slot slots[j] (int32, on k's device), the other slots hold unrelated random
    values, as a paged KV cache holds other requests' tokens.
    """
    import torch

    for name, tensor in (("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 3:
            raise ValueError(f"{name} must be a (T, H_kv, d) torch.Tensor")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    tokens = k.shape[0]
    extra = max(1, tokens // 4) if extra is None else extra
    if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
        raise ValueError(f"extra must be a non-negative int, got {extra!r}")
    slots_total = tokens + extra
    order = torch.randperm(slots_total, generator=torch.Generator().manual_seed(seed))
    slots = order[:tokens].to(torch.int32)
    caches = []
    for j, tensor in enumerate((k, v)):
        cache = inputs.random_tensor((slots_total, *tensor.shape[1:]), seed + 100 + j, tensor.dtype,
                                     tensor.device)
        cache[slots.long().to(tensor.device)] = tensor
        caches.append(cache)
    return caches[0], caches[1], slots.to(k.device)
