"""Checks for DeFT (notebooks 13 and 14): attention over a tree-structured KV cache.

A DeFT module exposes `node_groups` / `flatten_blocks` (phase 1), `group_partials`,
`reduce_partials`, `deft_node_attention` and `deft_flatten_attention` (see solutions/deft.py).
Every case is a small KV tree with a shape where DeFT goes wrong: a single node, a chain of
nodes, nodes of one token, a block boundary inside a node, more than 64 queries in a block,
one query (so that some nodes and blocks are seen by nobody), plus random trees from the
seed. Cases mix contiguous and paged KV, grouped-query attention, float16 and float32 (and
bfloat16 on a GPU). Each output is compared in full with the float64 dense-mask oracle
(`course.oracle.tree_kv_attention`), on sampled rows with `pyspec_ref.deft.tree_kv_attention`,
and each call runs twice: the reduction has no atomics, so the two runs must agree bit for bit.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

import pyspec_ref.deft as spec
from course import oracle
from course.checks import CaseResult, rerun_problem
from course.checks.diagnose import compare_floats, first_index
from course.core import inputs, runtime

SAMPLED_QUERIES = 3
# |error| allowed: atol + rtol * |expected|. float32 accumulates in float32 (a few hundred tokens);
# float16 / bfloat16 outputs are rounded to 11 / 8 significant bits (half an ulp of values
# up to ~2 is 1e-3 / 8e-3), and P is rounded to the input type before the P.V product.
TOLERANCE = {torch.float32: (2e-5, 1e-4), torch.float16: (3e-3, 3e-3), torch.bfloat16: (2e-2, 1e-2)}
LSE_TOLERANCE = {torch.float32: (2e-5, 1e-5), torch.float16: (2e-4, 1e-4), torch.bfloat16: (2e-4, 1e-4)}
PARTIAL_LABELS = ("partial", "head", "column")


@dataclass(frozen=True)
class KVTreeCase:
    """A KV tree with its queries and the shapes to run it at."""

    name: str
    parents: tuple[int, ...]
    lengths: tuple[int, ...]
    query_nodes: tuple[int, ...]
    heads_q: int
    heads_kv: int
    d: int
    dtype: torch.dtype
    paged: bool
    block_tokens: int

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    def label(self) -> str:
        layout = "paged" if self.paged else "contiguous"
        dtype = str(self.dtype).replace("torch.", "")
        return (f"{self.name} (T={self.num_tokens}, Q={len(self.query_nodes)}; H_q={self.heads_q}, "
                f"H_kv={self.heads_kv}, d={self.d}, {dtype}, {layout}, block {self.block_tokens})")


def _token_tree_under(prefix: int, size: int, rng: random.Random, max_children: int = 4):
    """A prefix node of `prefix` tokens, then a random token tree of `size` one-token nodes."""
    tree = inputs.random_tree(size + 1, rng, max_children=max_children)
    return [-1] + tree[1:], [prefix] + [1] * size


def _random_kv_tree(nodes: int, rng: random.Random, longest: int):
    """A random tree of `nodes` nodes with lengths 1..longest; queries at the leaves and one inner node."""
    parents = inputs.random_tree(nodes, rng, max_children=3)
    lengths = [rng.randint(1, longest) for _ in range(nodes)]
    has_child = set(parents[1:])
    leaves = [v for v in range(nodes) if v not in has_child]
    return parents, lengths, leaves + [rng.randrange(nodes)]


def kv_tree_cases(seed: int) -> list[KVTreeCase]:
    """The fixed edge cases, then random trees (tiny in the simulator), random tree #n drawn from
    `inputs.case_seed(seed, "random tree #n")` and named by its index and size, never its seed."""
    rng = random.Random(2025)
    x = runtime.pick(sim=1, gpu=8)  # multi-token nodes grow on a GPU
    d_small, d_big = runtime.pick(sim=(16, 32), gpu=(64, 128))
    f16, f32 = torch.float16, torch.float32
    low = torch.bfloat16 if runtime.on_gpu() else f16
    block = runtime.pick(sim=16, gpu=64)
    spec_tree = _token_tree_under(40 * x, 24, rng)
    wide = ([-1] + [0] * 70, [20 * x] + [1] * 70)  # 70 one-token children: 70 queries in a block
    one_query_parents = [-1, 0, 0, 1, 1, 2, 4, 4]
    cases = [
        ("a single node", [-1], [37 * x], [0, 0], (2, 2, d_small, f32, False, block)),
        ("a chain of nodes", [-1, 0, 1, 2, 3], [9 * x, 17 * x, 3, 20 * x, 5], [4, 2],
         (4, 2, d_small, f16, True, block)),
        ("nodes of one token (speculative token tree)", *spec_tree, list(range(1, 25)),
         (4, 1, d_big, f32, True, 2 * block)),
        ("block boundaries inside nodes", [-1, 0, 0, 1, 2], [21 * x, 13 * x, 30 * x, 7, 11 * x], [3, 4, 1],
         (4, 2, d_small, f16, False, block)),
        ("more than 64 queries in a block", *wide, list(range(1, 71)),
         (2, 1, d_small, f32, False, 2 * block)),
        ("one query", one_query_parents, [5 * x, 7, 12 * x, 3, 9, 4 * x, 6, 2], [6],
         (4, 4, d_small, low, True, block)),
    ]
    for n, (shape, nodes) in enumerate([((8, 2, d_small, f16, True, block), 9),
                                        ((2, 1, d_big, f32, False, 2 * block), 6)]):
        draw = random.Random(inputs.case_seed(seed, f"random tree #{n}"))
        parents, lengths, queries = _random_kv_tree(nodes, draw, 25 * x)
        cases.append((f"random tree #{n} ({nodes} nodes)", parents, lengths, queries, shape))
    return [KVTreeCase(name, tuple(p), tuple(lengths), tuple(q), *shape)
            for name, p, lengths, q, shape in cases]


@dataclass
class CaseTensors:
    q: torch.Tensor
    k: torch.Tensor  # (T, H_kv, d) in the flattened layout
    v: torch.Tensor
    cache_k: torch.Tensor  # what the kernel reads: k itself, or a paged cache
    cache_v: torch.Tensor
    slots: torch.Tensor | None


def case_tensors(case: KVTreeCase, seed: int, device=None) -> CaseTensors:
    """Random q, k, v for a case; for a paged case also a cache with extra rows and a random slot table."""
    device = device or runtime.torch_device()
    t, hkv, d = case.num_tokens, case.heads_kv, case.d
    q = inputs.random_tensor((len(case.query_nodes), case.heads_q, d), seed, case.dtype, device)
    k = inputs.random_tensor((t, hkv, d), seed + 1, case.dtype, device)
    v = inputs.random_tensor((t, hkv, d), seed + 2, case.dtype, device)
    if not case.paged:
        return CaseTensors(q, k, v, k, v, None)
    rows = t + t // 3 + 5
    slots = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))[:t].to(torch.int32)
    cache_k = inputs.random_tensor((rows, hkv, d), seed + 3, case.dtype, device)
    cache_v = inputs.random_tensor((rows, hkv, d), seed + 4, case.dtype, device)
    cache_k[slots.long().to(device)] = k
    cache_v[slots.long().to(device)] = v
    return CaseTensors(q, k, v, cache_k, cache_v, slots.to(device))


def _tree(case: KVTreeCase) -> tuple[list[int], list[int], list[int]]:
    return list(case.parents), list(case.lengths), list(case.query_nodes)


def reference_partials(prepared, case: KVTreeCase, tensors: CaseTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (out, lse) of every (group, query) partial of `prepared`, from the dense mask."""
    mask = oracle.tree_kv_mask(*_tree(case), tensors.q.device)
    members = prepared.member_query.long()
    group_of = torch.repeat_interleave(torch.arange(prepared.num_groups, device=members.device),
                                       (prepared.group_ptr[1:] - prepared.group_ptr[:-1]).long())
    tokens = torch.arange(case.num_tokens, device=members.device)
    start = prepared.group_start.long()[group_of, None]
    end = prepared.group_end.long()[group_of, None]
    within = mask[members] & (tokens >= start) & (tokens < end)  # (P, T)
    group = case.heads_q // case.heads_kv
    keys = tensors.k.double().repeat_interleave(group, dim=1).transpose(0, 1)
    values = tensors.v.double().repeat_interleave(group, dim=1).transpose(0, 1)
    out, lse = oracle.attention_with_lse(tensors.q.double()[members].transpose(0, 1), keys, values, within)
    return out.transpose(0, 1), lse.transpose(0, 1)


def _partials_problem(module, prepared, case, tensors, what: str) -> str:
    out_part, lse_part = module.group_partials(tensors.q, tensors.cache_k, tensors.cache_v, prepared,
                                               slots=tensors.slots)
    want_out, want_lse = reference_partials(prepared, case, tensors)
    atol, rtol = LSE_TOLERANCE[case.dtype]
    problem = compare_floats(lse_part, want_lse, "partial lse", PARTIAL_LABELS[:2], atol, rtol)
    if not problem:
        atol, rtol = TOLERANCE[case.dtype]  # float32 partials, from P rounded to the input type
        problem = compare_floats(out_part, want_out, "partial out", PARTIAL_LABELS, atol, rtol)
    if not problem:
        return ""
    return f"{problem}\n{_where_is_partial(prepared, problem, what)}"


def _where_is_partial(prepared, problem: str, what: str) -> str:
    """Name the group and query of the partial a message points at ('partial 12, ...')."""
    try:
        p = int(problem.split("partial ", 1)[1].split(",", 1)[0])
    except (IndexError, ValueError):
        return ""
    ptr = prepared.group_ptr.cpu()
    group = int(torch.searchsorted(ptr, torch.tensor(p, dtype=ptr.dtype), right=True)) - 1
    query = int(prepared.member_query[p])
    start, end = int(prepared.group_start[group]), int(prepared.group_end[group])
    return (f"(partial {p} is query {query} in {what} {group}, tokens [{start}, {end}); partials are "
            "numbered by their place in prepared.member_query)")


def _sampled_spec_problem(out, case: KVTreeCase, tensors: CaseTensors, seed: int) -> str:
    """A few queries and one head against pyspec_ref.deft.tree_kv_attention, the specification itself."""
    rng = random.Random(seed)
    queries = sorted(rng.sample(range(len(case.query_nodes)), min(SAMPLED_QUERIES, len(case.query_nodes))))
    head = rng.randrange(case.heads_q)
    kv_head = head // (case.heads_q // case.heads_kv)
    want, _ = spec.tree_kv_attention(
        tensors.q[queries, head].double().tolist(), tensors.k[:, kv_head].double().tolist(),
        tensors.v[:, kv_head].double().tolist(), list(case.parents), list(case.lengths),
        [case.query_nodes[i] for i in queries])
    atol, rtol = TOLERANCE[case.dtype]
    for row, i in zip(want, queries, strict=True):
        problem = compare_floats(out[i, head].cpu(), torch.tensor(row), "out", ("column",), atol, rtol)
        if problem:
            return f"query {i}, head {head} (vs pyspec_ref.deft): {problem}"
    return ""


def _attention_problem(attend, prepared, case: KVTreeCase, tensors: CaseTensors, seed: int):
    """Run `attend` twice; compare with the oracle in full, pyspec on sampled rows, and itself."""
    out, lse = attend(tensors.q, tensors.cache_k, tensors.cache_v, prepared, slots=tensors.slots,
                      return_lse=True)
    again = attend(tensors.q, tensors.cache_k, tensors.cache_v, prepared, slots=tensors.slots,
                   return_lse=True)
    if out.dtype != case.dtype:
        return out, f"out has dtype {out.dtype}, expected q's dtype {case.dtype}"
    want_out, want_lse = oracle.tree_kv_attention(tensors.q, tensors.k, tensors.v, *_tree(case))
    atol, rtol = TOLERANCE[case.dtype]
    problem = compare_floats(out, want_out, "out", ("query", "head", "column"), atol, rtol)
    if not problem:
        atol, rtol = LSE_TOLERANCE[case.dtype]
        problem = compare_floats(lse, want_lse, "lse", ("query", "head"), atol, rtol)
    problem = (problem or _sampled_spec_problem(out, case, tensors, seed)
               or rerun_problem((out, lse), again))
    return out, problem


def check_deft_node(module, seed: int):
    """DeFT-Node: partials per (node group, query), then the merged output, against the references."""
    for case in kv_tree_cases(seed):
        def run(case=case):
            drawn = inputs.case_seed(seed, case.label())
            tensors = case_tensors(case, drawn)
            prepared = module.node_groups(*_tree(case), tensors.q.device)
            problem = _partials_problem(module, prepared, case, tensors, "node group")
            if not problem:
                _, problem = _attention_problem(module.deft_node_attention, prepared, case, tensors,
                                                drawn + 5)
            return CaseResult(case.label(), False, problem) if problem else None
        yield case.label(), run


def check_deft_flatten(module, seed: int):
    """DeFT-Flatten: partials per (block, query), the merged output, and agreement with DeFT-Node."""
    for case in kv_tree_cases(seed):
        def run(case=case):
            drawn = inputs.case_seed(seed, case.label())
            tensors = case_tensors(case, drawn)
            prepared = module.flatten_blocks(*_tree(case), case.block_tokens, tensors.q.device)
            problem = _partials_problem(module, prepared, case, tensors, "block group")
            if not problem:
                out, problem = _attention_problem(module.deft_flatten_attention, prepared, case, tensors,
                                                  drawn + 5)
            if not problem:
                node = module.deft_node_attention(tensors.q, tensors.cache_k, tensors.cache_v,
                                                  module.node_groups(*_tree(case), tensors.q.device),
                                                  slots=tensors.slots)
                atol, rtol = TOLERANCE[case.dtype]
                problem = compare_floats(out, node, "out", ("query", "head", "column"), 2 * atol, 2 * rtol)
                problem = problem and f"DeFT-Flatten and DeFT-Node disagree: {problem}"
            return CaseResult(case.label(), False, problem) if problem else None
        yield case.label(), run


# --------------------------------------------------------------------------- the reduction alone


def _random_partials(seed: int, n_queries: int, heads: int, d: int, most: int, lse_range, device):
    """Random float32 partials, 1..most per query, stored in a shuffled order."""
    rng = random.Random(seed)
    counts = [rng.randint(1, most) for _ in range(n_queries)]
    total = sum(counts)
    order = list(range(total))
    rng.shuffle(order)  # a query's partials are anywhere in the buffer
    query_ptr = [0]
    for count in counts:
        query_ptr.append(query_ptr[-1] + count)
    out_part = inputs.random_tensor((total, heads, d), seed, torch.float32, device)
    low, high = lse_range
    unit = inputs.random_tensor((total, heads), seed + 1, torch.float64).sigmoid()
    lse_part = (low + (high - low) * unit).to(torch.float32).to(device)
    return (out_part, lse_part, torch.tensor(query_ptr, dtype=torch.int32, device=device),
            torch.tensor(order, dtype=torch.int32, device=device))


def reference_merge(out_part, lse_part, query_ptr, query_parts):
    """float64 (out, lse): each query's partials merged by log-sum-exp (Flash-Decoding; DeFT §3.4)."""
    outs, lses = [], []
    for i in range(query_ptr.shape[0] - 1):
        parts = query_parts[int(query_ptr[i]) : int(query_ptr[i + 1])].long()
        lse = lse_part[parts].double()  # (n, H)
        total = torch.logsumexp(lse, dim=0)
        weights = torch.exp(lse - total)  # (n, H)
        outs.append((weights[..., None] * out_part[parts].double()).sum(dim=0))
        lses.append(total)
    return torch.stack(outs), torch.stack(lses)


def check_reduce_partials(module, seed: int):
    """module.reduce_partials(out_part, lse_part, query_ptr, query_parts, out_dtype=) vs a float64 merge."""
    device = runtime.torch_device()
    d_small, d_big = runtime.pick(sim=(16, 32), gpu=(64, 128))
    n = runtime.pick(sim=1, gpu=8)
    cases = [
        ("one partial per query (the merge must return it unchanged)", 5 * n, 2, d_small, 1, (-3.0, 3.0),
         torch.float32),
        ("up to 6 partials per query, 3 heads", 17 * n, 3, d_small, 6, (-4.0, 6.0), torch.float32),
        ("lse far below 0 (a running max started at 0 instead of -inf underflows)", 9 * n, 4, d_small, 4,
         (-160.0, -110.0), torch.float32),
        ("lse far above 0", 9 * n, 4, d_small, 4, (60.0, 85.0), torch.float32),
        ("float16 output, 20 heads", 6 * n, 20, d_big, 5, (-2.0, 2.0), torch.float16),
        ("many partials per query (a long prefix cut in many blocks: a long merge loop)", 3, 2, d_big,
         40 * n, (-1.0, 1.0), torch.float32),
    ]
    for name, queries, heads, d, most, lse_range, dtype in cases:
        def run(name=name, queries=queries, heads=heads, d=d, most=most, lse_range=lse_range, dtype=dtype):
            args = _random_partials(inputs.case_seed(seed, name), queries, heads, d, most, lse_range, device)
            out, lse = module.reduce_partials(*args, out_dtype=dtype)
            again = module.reduce_partials(*args, out_dtype=dtype)
            want_out, want_lse = reference_merge(*args)
            if out.dtype != dtype:
                return CaseResult(name, False, f"out has dtype {out.dtype}, expected {dtype}")
            atol, rtol = TOLERANCE[dtype]
            problem = (compare_floats(out, want_out, "out", ("query", "head", "column"), atol, rtol)
                       or compare_floats(lse, want_lse, "lse", ("query", "head"), 1e-5, 1e-6))
            if problem:
                why = explain_merge(out, want_out, *args, atol, rtol)
                problem += f"\n{why}" if why else ""
            problem = problem or rerun_problem((out, lse), again)
            return CaseResult(name, False, problem) if problem else None
        yield name, run


def explain_merge(out, want_out, out_part, lse_part, query_ptr, query_parts, atol: float, rtol: float) -> str:
    """Why a merged row is wrong: '' if no story fits, else which part of the running merge.

    The first wrong (query, head) is replayed partial by partial in float64, as reduce_partials_kernel
    merges (Flash-Decoding's recurrence around a running max m: alpha = exp(m_old - m_new) rescales
    what was summed), with the rescale of the output, of the sum, or the update of m left out. The
    message names the partial where the replay first departs from the right merge.
    """
    out, want_out = out.detach().cpu().double(), want_out.cpu().double()
    wrong = ((out - want_out).abs() > atol + rtol * want_out.abs()).any(-1) & out.isfinite().all(-1)
    if not wrong.any():
        return ""
    query, head = first_index(wrong)
    parts = query_parts[int(query_ptr[query]):int(query_ptr[query + 1])].long().cpu()
    lses = lse_part[parts, head].cpu().double()
    outs = out_part[parts, head].cpu().double()
    for slip, what in MERGE_SLIPS:
        if torch.allclose(out[query, head], _merge_replay(lses, outs, *slip), atol=atol, rtol=rtol):
            if slip == (True, True, False):
                where = (f"every step finds m = -inf and rescales what came before by exp(-inf) = 0: the row "
                         f"equals its last partial (buffer row {int(parts[-1])})")
            else:
                step = next(i for i in range(1, len(lses)) if lses[i] > lses[:i].max())
                where = (f"it goes wrong at its partial {step} (buffer row {int(parts[step])}), the first "
                         "whose lse raises the running max")
            return f"query {query}, head {head}: equals the merge replayed with {what}: {where}"
    return ""


# (rescale the output, rescale the sum, update the running max), and the slip in words
MERGE_SLIPS = (
    ((False, True, True), "the output never rescaled by exp(m_old - m_new) (missing rescale?)"),
    ((True, False, True), "the running sum never rescaled by exp(m_old - m_new) (missing rescale?)"),
    ((True, True, False), "the running max m never updated"),
)


def _merge_replay(lses, outs, rescale_out: bool, rescale_sum: bool, update_max: bool) -> torch.Tensor:
    """reduce_partials_kernel's recurrence for one (query, head) in float64, with a step left out."""
    m, l, acc = float("-inf"), 0.0, torch.zeros_like(outs[0])
    for lse, part in zip(lses.tolist(), outs, strict=True):
        m_new = max(m, lse)
        alpha = math.exp(m - m_new) if m_new > float("-inf") else 0.0
        w = math.exp(lse - m_new)
        l = (l * alpha if rescale_sum else l) + w
        acc = (acc * alpha if rescale_out else acc) + w * part
        m = m_new if update_max else m
    return acc / l
