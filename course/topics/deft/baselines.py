"""The attention kernels DeFT is measured against (notebook 14, `course.topics.deft.bench`).

Every baseline computes the same thing as DeFT (Yao et al., §3): for query i, softmax attention
over every token on the root path of its node `workload.query_nodes[i]`, with grouped-query
heads (query head h reads KV head h // (H_q / H_kv)) and scale 1/sqrt(d). Inputs are the
DeFT data model's: q (Q, H_q, d), k and v (T, H_kv, d) in the flattened DFS token layout
(`course.topics.deft.workloads`); outputs (Q, H_q, d) in q's dtype. What differs is how many bytes each
one moves, which is the whole point of the comparison (DeFT Table 4):

sequence        Sequence-based decoding, Flash-Decoding style (Dao et al., 2023): each query is
                its own sequence with its own KV cache, a copy of its root path, so a prefix
                shared by Q queries is stored and read Q times. The copies are made once, outside
                the timing (as a sequence-based server keeps one cache per sequence), then one
                batched SDPA call attends every query to its own cache. The 4 query heads of a KV
                head are packed as 4 query rows (what FlashInfer and Flash-Decoding do for GQA),
                so each cache is read once per query, not once per query head. Paths of unequal
                length are padded, with a key-padding mask.
medusa_dense    Tree Attention as in Medusa (Cai et al., 2024): all T tokens of the tree as keys,
                a dense (Q, T) mask (built once, outside the timing, as SDPA's additive float
                mask, see `additive_mask`) through SDPA. The GQA
                group is packed into the query rows again: one SDPA "head" per KV head with 4*Q
                rows, so the whole tree's KV is read once per query block of the SDPA kernel.
flex            FlexAttention (PyTorch, torch.compile'd) with a block mask built from the DFS
                intervals: key token j (of node n_j) is visible to query i (of node n_i) iff
                start[n_j] <= start[n_i] and end[n_i] <= end[n_j] (FlashSpecInfer §5.1 on the
                node tree). Same GQA packing. Key blocks no query of a query block sees are
                skipped; the rest are read once per query block.
triton_tree     Notebook 12's Triton kernel (`solutions.triton_attention`), which is *square* tree
                attention: N tokens, each both a query row and a key, over a token tree. The KV
                tree maps onto it exactly: make every token a node (a node of L tokens becomes a
                chain of L token nodes; a child node's first token hangs off its parent's last
                token). In the flattened layout that token tree is already numbered in DFS
                preorder, so start = 0..T-1 and end[j] = the last token of j's node's subtree.
                Query i is the row of its own token (the last token of its node: its KV is that
                token's, and that token sees exactly its root path), so N = T and the output is
                read at those Q rows. The cost of this mapping: the kernel also computes the T - Q
                rows nobody asked for, and each of them attends to its own root path, so a
                P-token prefix costs a causal prefill of P tokens (about P^2/2 scores per head)
                instead of Q * P. It also needs one K/V head per query head (K and V are
                expanded 4x, outside the timing). Queries must be at distinct nodes (two queries
                at one node would need the same row).

All four accept CPU tensors (the tests run them there; the Triton kernel runs in the
interpreter); `flex(..., compile=False)` runs FlexAttention's unfused eager implementation,
which is what CPU tests use. `make_<name>(q, k, v, workload)` does the once-per-tree work and
returns a function of no arguments that runs the timed part; `<name>(q, k, v, workload)` runs
both. Their float64 oracle is `course.oracle.tree_kv_attention`.
"""

from __future__ import annotations

import torch

import pyspec_ref
from course.core.validate import require_tensor
from course.topics.deft import workloads as workloads_module
from course.topics.deft.workloads import Workload

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class BaselineUnavailable(RuntimeError):
    """A baseline cannot run on this workload or machine (the message says why)."""


# --------------------------------------------------------------------------- checks and layout


def check_inputs(q, k, v, workload) -> tuple[int, int, int, int, int]:
    """Check q (Q, H_q, d), k and v (T, H_kv, d) against the workload; return (Q, T, H_q, H_kv, d)."""
    if not isinstance(workload, Workload):
        raise TypeError("workload must be a course.topics.deft.workloads.Workload, got "
                        f"{type(workload).__name__}")
    require_tensor(q, "q", ndim=3, dtypes=FLOAT_DTYPES, on_kernel_device=False)
    for name, tensor in (("k", k), ("v", v)):
        require_tensor(tensor, name, ndim=3, dtypes=(q.dtype,), on_kernel_device=False)
        if tensor.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {tensor.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    queries, heads_q, d = q.shape
    tokens, heads_kv, d_kv = k.shape
    if queries != workload.queries:
        raise ValueError(f"q has {queries} rows, but the workload has Q = {workload.queries} queries")
    if tokens != workload.tokens:
        raise ValueError(f"k has {tokens} tokens, but the workload's tree has T = {workload.tokens}")
    if d_kv != d:
        raise ValueError(f"k's head dimension {d_kv} differs from q's {d}")
    if heads_q % heads_kv:
        raise ValueError(f"q's heads ({heads_q}) must be a multiple of k's heads ({heads_kv}) "
                         "(grouped-query attention)")
    return queries, tokens, heads_q, heads_kv, d


def _node_layout(workload: Workload):
    """(offsets, node start times, node end times) as lists: pyspec_ref's definitions."""
    offsets = workloads_module.token_offsets(workload)
    start, end = pyspec_ref.dfs_times(list(workload.parents))
    return offsets, start, end


def token_nodes(workload: Workload, device=None) -> torch.Tensor:
    """(T,) int64: the node each flattened token belongs to."""
    offsets, _, _ = _node_layout(workload)
    order = sorted(range(workload.nodes), key=offsets.__getitem__)  # nodes in layout order
    return torch.repeat_interleave(torch.tensor(order, dtype=torch.int64),
                                   torch.tensor([workload.lengths[n] for n in order])).to(device)


def visibility_mask(workload: Workload, device=None) -> torch.Tensor:
    """(Q, T) bool: query i sees flattened token j iff j's node is on the root path of i's node.

    The DFS-interval test of FlashSpecInfer §5.1 on the node tree, vectorised; equal to
    `pyspec_ref.deft.visible_tokens` (the tests check it).
    """
    _, start, end = _node_layout(workload)
    start, end = torch.tensor(start), torch.tensor(end)
    nodes = token_nodes(workload)
    queries = torch.tensor(workload.query_nodes)
    mask = (start[nodes][None, :] <= start[queries][:, None]) & (end[queries][:, None] <= end[nodes][None, :])
    return mask.to(device)


def token_tree_times(workload: Workload, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(start, end), int32 (1, T): DFS times of the token tree (every token a node), see triton_tree."""
    offsets, start, end = _node_layout(workload)
    by_start = {s: node for node, s in enumerate(start)}
    # The subtree of node n occupies tokens offsets[n] .. the last token of the last node of its
    # subtree in preorder, the node whose start time is end[n].
    last = [offsets[by_start[end[n]]] + workload.lengths[by_start[end[n]]] - 1 for n in range(workload.nodes)]
    nodes = token_nodes(workload)
    token_end = torch.tensor(last, dtype=torch.int64)[nodes]
    token_start = torch.arange(workload.tokens)
    return (token_start.to(torch.int32)[None].to(device), token_end.to(torch.int32)[None].to(device))


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as SDPA's additive float mask (0 visible, -inf hidden), built once.

    SDPA turns a bool mask into this on every call, and its memory-efficient kernel wants the
    mask's rows 16-aligned (it pads a copy otherwise): both would land inside the timing. So the
    rows are stored padded to a multiple of 16 and a view of the first T columns is returned.
    """
    columns = mask.shape[-1]
    padded = torch.full((*mask.shape[:-1], -(-columns // 16) * 16), float("-inf"), dtype=dtype,
                        device=mask.device)
    padded[..., :columns].masked_fill_(mask, 0.0)
    return padded[..., :columns]


def _pack_gqa(q: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """(Q, H_q, d) -> (Q, H_kv, G, d): query head h = kv * G + g reads KV head kv."""
    queries, heads_q, d = q.shape
    return q.reshape(queries, heads_kv, heads_q // heads_kv, d)


# --------------------------------------------------------------------------- (a) sequence-based


def path_indices(workload: Workload, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(index (Q, L), valid (Q, L)): each query's root-path tokens in order, padded to the longest."""
    mask = visibility_mask(workload, device)
    counts = mask.sum(dim=1)
    longest = int(counts.max())
    # A stable sort of "not visible" puts the visible tokens first, in layout (root-first) order.
    index = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices[:, :longest]
    valid = torch.arange(longest, device=mask.device)[None, :] < counts[:, None]
    return index, valid


def make_sequence_based(q, k, v, workload: Workload):
    """Sequence-based decoding (see the module docstring): per-query KV copies, then batched SDPA."""
    queries, _, heads_q, heads_kv, d = check_inputs(q, k, v, workload)
    index, valid = path_indices(workload, q.device)
    # One KV cache per query: (Q, H_kv, L, d), a copy of the root path (re-read per query).
    caches = [t[index].permute(0, 2, 1, 3).contiguous() for t in (k, v)]
    # Equal paths need no mask (then SDPA may pick its flash kernel); else hide the padding.
    mask = None if bool(valid.all()) else additive_mask(valid, q.dtype)[:, None, None, :]
    packed = _pack_gqa(q, heads_kv)

    def run():
        out = torch.nn.functional.scaled_dot_product_attention(packed, caches[0], caches[1], attn_mask=mask)
        return out.reshape(queries, heads_q, d)

    run.kv_copy_bytes = sum(c.numel() * c.element_size() for c in caches)
    return run


def sequence_based(q, k, v, workload: Workload) -> torch.Tensor:
    return make_sequence_based(q, k, v, workload)()


# --------------------------------------------------------------------------- (b) dense mask


def make_medusa_dense(q, k, v, workload: Workload):
    """Tree Attention-Medusa: SDPA over all T tokens with a dense (Q, T) mask, GQA packed."""
    queries, _, heads_q, heads_kv, d = check_inputs(q, k, v, workload)
    group = heads_q // heads_kv
    mask = additive_mask(visibility_mask(workload, q.device).repeat(group, 1), q.dtype)[None, None]  # g*Q+i
    # (1, H_kv, G * Q, d): the G query heads of a KV head stacked as rows
    packed = _pack_gqa(q, heads_kv).permute(1, 2, 0, 3).reshape(1, heads_kv, group * queries, d)
    keys, values = (t.permute(1, 0, 2).unsqueeze(0).contiguous() for t in (k, v))  # (1, H_kv, T, d)

    def run():
        out = torch.nn.functional.scaled_dot_product_attention(packed, keys, values, attn_mask=mask)
        return out.reshape(heads_kv, group, queries, d).permute(2, 0, 1, 3).reshape(queries, heads_q, d)

    return run


def medusa_dense(q, k, v, workload: Workload) -> torch.Tensor:
    return make_medusa_dense(q, k, v, workload)()


# --------------------------------------------------------------------------- (c) FlexAttention

_compiled_flex = None


def make_flex(q, k, v, workload: Workload, *, compile: bool = True):
    """FlexAttention with a block mask from the node DFS intervals, GQA packed (module docstring).

    compile=True uses torch.compile(flex_attention) (the fused kernel; a GPU); compile=False the
    unfused eager implementation (CPU tests). A compile failure surfaces at the first call.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    global _compiled_flex
    queries, _, heads_q, heads_kv, d = check_inputs(q, k, v, workload)
    group = heads_q // heads_kv
    _, start, end = _node_layout(workload)
    start, end = torch.tensor(start, device=q.device), torch.tensor(end, device=q.device)
    nodes = token_nodes(workload, q.device)
    key_start, key_end = start[nodes], end[nodes]
    query_nodes = torch.tensor(workload.query_nodes, device=q.device)
    query_start, query_end = start[query_nodes], end[query_nodes]

    def sees(b, h, row, key):
        i = row % queries  # row g * Q + i is query i, head group g
        return (key_start[key] <= query_start[i]) & (query_end[i] <= key_end[key])

    block_mask = create_block_mask(sees, 1, None, group * queries, workload.tokens, device=q.device)
    packed = _pack_gqa(q, heads_kv).permute(1, 2, 0, 3).reshape(1, heads_kv, group * queries, d)
    keys, values = (t.permute(1, 0, 2).unsqueeze(0).contiguous() for t in (k, v))
    if compile and _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    if compile:  # one compilation per shape: let a benchmark's dozen shapes all compile
        torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    attend = _compiled_flex if compile else flex_attention

    def run():
        out = attend(packed, keys, values, block_mask=block_mask)
        return out.reshape(heads_kv, group, queries, d).permute(2, 0, 1, 3).reshape(queries, heads_q, d)

    return run


def flex(q, k, v, workload: Workload, *, compile: bool = True) -> torch.Tensor:
    return make_flex(q, k, v, workload, compile=compile)()


# --------------------------------------------------------------------------- (d) notebook 12's kernel


def make_triton_tree(q, k, v, workload: Workload, *, impl: str = "solutions", kernels_only: bool = True):
    """Notebook 12's square tree-attention kernel on the token tree (mapping in the module docstring).

    The timed function launches the attention kernel alone (`prepare_attention(...).attention`, after one
    full call that also builds the per-tree key-block lists) when kernels_only, else the whole
    launcher, input checks included.
    """
    from course.core.impl import load

    queries, tokens, heads_q, heads_kv, d = check_inputs(q, k, v, workload)
    if len(set(workload.query_nodes)) != queries:
        raise BaselineUnavailable("triton_tree maps query i to the row of its node's last token, so the "
                                  "queries must be at distinct nodes")
    try:
        module = load("triton_attention", impl)
        from course.topics.triton_attention.launch import prepare_attention
        from course.topics.triton_attention.validate import DTYPES, HEAD_DIMS
    except ImportError as error:
        raise BaselineUnavailable(f"notebook 12's kernel ({impl}.triton_attention) is missing: {error}") \
            from error
    if d not in HEAD_DIMS or q.dtype not in DTYPES:
        raise BaselineUnavailable(f"notebook 12's kernel takes d in {HEAD_DIMS} and dtypes "
                                  f"{DTYPES}, got d = {d}, {q.dtype}")
    group = heads_q // heads_kv
    rows = torch.tensor(workloads_module.query_tokens(workload), device=q.device)
    # Rows that are no query attend too (the mapping's waste); their values do not matter.
    square_q = torch.zeros((1, heads_q, tokens, d), dtype=q.dtype, device=q.device)
    square_q[0, :, rows] = q.permute(1, 0, 2)
    square_k, square_v = (t.permute(1, 0, 2).repeat_interleave(group, dim=0).unsqueeze(0).contiguous()
                          for t in (k, v))  # one K/V head per query head
    start, end = token_tree_times(workload, q.device)
    call = prepare_attention(module, square_q, square_k, square_v, start, end)
    call()  # builds the key-block lists once per tree
    attend = call.attention if kernels_only else call

    def run():
        return attend()[0, :, rows].permute(1, 0, 2)

    run.rows_computed = tokens
    return run


def triton_tree(q, k, v, workload: Workload, *, impl: str = "solutions") -> torch.Tensor:
    return make_triton_tree(q, k, v, workload, impl=impl)()


BASELINES = {
    "sequence": make_sequence_based,
    "medusa_dense": make_medusa_dense,
    "flex": make_flex,
    "triton_tree": make_triton_tree,
}
