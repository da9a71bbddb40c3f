"""Checks of the KV cache's kernels: EMS-SD's unpadded attention (notebook 17) and SwiftSpec's
tree-aware cache (notebook 18): compaction and non-square attention.

EMS-SD. A module exposes `unpadded_attention(q, k_cache, v_cache, counts, kv_starts, kv_lengths, *,
return_lse=False)` for q (T, H, d) and a cache (S, H_kv, d) (see `solutions.emssd`). Every case
is compared in full with a float64 torch oracle (`course.oracle.kvcache.unpadded_attention`: a dense (T, S)
mask built straight from the EMS-SD rule), on one head with `pyspec_ref.kvcache.unpadded_attention` itself,
and runs twice: the two runs must agree bit for bit. Tolerances as for notebook 12's kernel
(`course.topics.triton_attention.check.TOLERANCES`): standard-normal inputs, float32 accumulation.

The batches are tiny (the interpreter runs every op in NumPy) but cover: one sample; a sample
with 0 new tokens (it owns no flat token); a sample with an empty cache (KV length 0); samples of
very different lengths (several KV blocks against one); regions scattered in the cache out of
sample order, with gaps; tiles of 16 tokens that straddle samples; grouped-query attention; and
counts that do not add up to q's rows, which must be refused with a ValueError naming counts.

SwiftSpec. A module exposes (see `solutions.swiftspec`):

* `compact(cache, src, dst, counts)`: in place, cache (B, R, C, d), moves along dim 2, and
  `plan_tensors(plans, device)` turning `pyspec_ref.kvcache.compact_plan` lists into tensors;
* `tree_cache_attention(q, k_cache, v_cache, q_start, q_end, kv_start, kv_end, prefix_lengths,
  tree_lengths, *, query_counts=None, return_lse=False)`.

Compaction is exact (it copies bits), so it is compared bit for bit with
`pyspec_ref.kvcache.apply_moves`, and independently with `pyspec_ref.kvcache.reroot`: after the
moves, every slot of the new [prefix | tree] must hold the KV row of the right old node (no row
lost or duplicated). A wrong slot is diagnosed by which old slot its row came from. Bad moves must
raise a ValueError naming the argument, with the cache unchanged.

Attention is compared in full with a float64 torch oracle (`course.oracle.kvcache.nonsquare_tree_attention`:
a dense W x C mask from the interval rule), on one (sample, head) with
`pyspec_ref.kvcache.nonsquare_tree_attention` itself, and run twice (bit-for-bit equal).
Tolerances as for notebook 12's kernel (`course.topics.triton_attention.check.TOLERANCES`). The
property of SwiftSpec §3.2: attention after re-rooting and compaction equals attention computed
from scratch on the re-rooted tree (bit for bit: the rows read are the same bits).
"""

from __future__ import annotations

import random

import torch

import pyspec_ref
import pyspec_ref.kvcache as spec
from course.checks import CaseResult, rerun_problem
from course.checks.diagnose import compare_floats
from course.checks.diagnose_attention import MASK_SLIPS, MASK_TEST, explain_attention
from course.core import inputs, runtime
from course.oracle import attention_with_lse
from course.oracle import kvcache as kv_oracle
from course.topics.triton_attention.check import LSE_TOLERANCE, TOLERANCES, dtype_name

LABELS = ("sample", "head", "query", "column")
LSE_LABELS = ("sample", "head", "query")


# --------------------------------------------------------------------------- shared helpers


def random_root_path(parents, rng: random.Random, stop: float = 0.25) -> list[int]:
    """A random verified path: from the root, step to a random child until a leaf or, with
    probability `stop` per step, earlier (the target rejected the next draft)."""
    children = pyspec_ref.children(parents)
    path = [pyspec_ref.root(parents)]
    while children[path[-1]] and rng.random() >= stop:
        path.append(rng.choice(children[path[-1]]))
    return path


def tree_rows(parents, prefix_len: int, capacity: int, order: list[int] | None = None):
    """Where a tree lives in a [prefix | tree] cache of `capacity` rows.

    Returns (slot_of, kv_start, kv_end): node v sits at row slot_of[v] (DFS preorder,
    prefix_len + start[v], unless `order` lists the nodes in the order of their rows), and the
    (capacity,) lists kv_start/kv_end hold each tree row's node interval (0 elsewhere)."""
    start, end = pyspec_ref.dfs_times(list(parents)) if len(parents) else ([], [])
    n = len(start)
    nodes = list(order) if order is not None else sorted(range(n), key=lambda v: start[v])
    slot_of = [0] * n
    kv_start, kv_end = [0] * capacity, [0] * capacity
    for i, v in enumerate(nodes):
        slot_of[v] = prefix_len + i
        kv_start[prefix_len + i], kv_end[prefix_len + i] = start[v], end[v]
    return slot_of, kv_start, kv_end


def slot_sources(prefix_len: int, parents, path, capacity: int) -> list[int]:
    """sources[j] = the old slot whose row slot j holds after the compaction of `compact_plan`
    (`pyspec_ref.kvcache.apply_moves` on the slot numbers themselves)."""
    return spec.apply_moves(list(range(capacity)), spec.compact_plan(prefix_len, list(parents), list(path)))


def _values_of(cache: torch.Tensor) -> torch.Tensor:
    """The cache's bits as integers (comparison of copied rows must be exact, NaN-safe)."""
    kinds = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    return cache.detach().cpu().contiguous().view(kinds[cache.element_size()])


def _moved_problem(got: torch.Tensor, want: torch.Tensor, old: torch.Tensor, sources: list[list[int]]) -> str:
    """'' when equal; else which (sample, stacked row, slot) holds which old slot's row."""
    g, w, o = _values_of(got), _values_of(want), _values_of(old)
    wrong = (g != w).any(dim=3)  # (B, R, C)
    if not wrong.any():
        return ""
    b, r, j = (int(i) for i in torch.nonzero(wrong)[0])
    match = torch.nonzero((o[b, r] == g[b, r, j]).all(dim=1)).flatten().tolist()
    came = (f"the row of old slot {match[0]}" if match else "a row that was nowhere in the old cache "
            "(a torn or mixed copy)")
    src = sources[b][j]
    expected = f"the row of old slot {src} (moved {src} -> {j})" if src != j else "its own row (not moved)"
    return (f"sample {b}, stacked row {r}, slot {j}: holds {came}, expected {expected} "
            f"({int(wrong.sum())} wrong (row, slot) pairs)")


# --------------------------------------------------------------------------- compaction check


def _compaction_case(module, plans_in, rows: int, capacity: int, d: int, dtype, seed: int, *,
                     view: bool = False, shuffle: bool = False) -> str:
    """Compact a random cache with the plans of (prefix_len, parents, path) per sample; '' if right."""
    device = runtime.torch_device()
    batch = len(plans_in)
    plans = [spec.compact_plan(p, list(t), list(path)) for p, t, path in plans_in]
    if shuffle:
        rng = random.Random(seed)
        plans = [rng.sample(plan, len(plan)) for plan in plans]
    sources = [slot_sources(p, t, path, capacity) for p, t, path in plans_in]
    if view:  # the capstone's layout: one tensor for the whole model, k/v heads as a slice of dim 1
        data = inputs.random_tensor((batch, rows + 3, capacity, d), seed, dtype, device)
        cache = data[:, 1:rows + 1]
    else:
        data = inputs.random_tensor((batch, rows, capacity, d), seed, dtype, device)
        cache = data
    old, old_data = cache.clone(), data.clone()
    src, dst, counts = module.plan_tensors(plans, device)
    returned = module.compact(cache, src, dst, counts)
    if returned is not None and returned is not cache and returned.data_ptr() != cache.data_ptr():
        return "compact must work in place (return the cache itself, or None)"
    problem = _moved_problem(cache, kv_oracle.compaction(old, sources), old, sources)
    if problem:
        return problem
    if view:
        outside = torch.ones(data.shape[1], dtype=torch.bool)
        outside[1:rows + 1] = False
        if not torch.equal(_values_of(data[:, outside]), _values_of(old_data[:, outside])):
            return "rows outside the cache view were modified"
    return ""


SAMPLE_DRAWS = 100  # random trees drawn at most for a sample of a compaction case


def compaction_cases(seed: int):
    """(name, plans_in, R, C, d, dtype, options) of every compaction case; a case's random samples
    come from its own seed, `inputs.case_seed(seed, name)`."""
    big = runtime.pick(sim=40, gpu=300)

    def drawn(name):
        return name, random.Random(inputs.case_seed(seed, name))

    def random_sample(rng, n, prefix):
        """A random tree and verified path whose compaction moves rows (a path down first children
        often keeps every row in place, and a sample with no move shows nothing)."""
        for _ in range(SAMPLE_DRAWS):
            order = rng.choice(["bfs", "dfs"])
            parents = inputs.random_tree(n, rng, max_children=rng.randint(1, 4), order=order)
            path = random_root_path(parents, rng)
            if spec.compact_plan(prefix, parents, path):
                return prefix, tuple(parents), tuple(path)
        raise RuntimeError(f"no random tree of {n} nodes in {SAMPLE_DRAWS} draws has a path that moves a row")

    shift = [-1, 0] + [0] + list(range(2, big + 1))  # root -> leaf 1, root -> chain 2..big+1
    caterpillar = inputs.caterpillar(big)
    deep_path = [0]
    while True:  # down the spine of the caterpillar
        spine = [v for v in range(len(caterpillar)) if caterpillar[v] == deep_path[-1]]
        if not spine or len(deep_path) > big // 3:
            break
        deep_path.append(spine[0])
    cap = big + 24
    paths, paths_rng = drawn("random trees, random verified paths")
    one_node, one_node_rng = drawn("a one-node tree (no move) beside a sample that moves")
    shuffled, shuffled_rng = drawn("moves given in shuffled order")
    view, view_rng = drawn("a view data[:, a:b] of a whole-model cache (layers x {k, v} x heads), float16")
    cases = [
        (paths, [random_sample(paths_rng, paths_rng.randint(5, big // 2), paths_rng.randint(0, 9))
                 for _ in range(3)], 3, cap, 16, torch.float32, {}),
        (f"overlap: a kept subtree of {big} rows shifts left by one slot (many chunks of moves)",
         [(5, tuple(shift), (0, 2))], 2, cap, 16, torch.float32, {}),
        ("a long committed path down a caterpillar, then its subtree",
         [(3, tuple(caterpillar), tuple(deep_path))], 2, cap, 32, torch.float16, {}),
        (one_node, [(4, (-1,), (0,)), random_sample(one_node_rng, 20, 2), (0, (-1, 0, 0), (0,))], 2, cap, 16,
         torch.float32, {}),
        (shuffled, [random_sample(shuffled_rng, shuffled_rng.randint(10, big), 6) for _ in range(2)], 2, cap,
         16, torch.float32, {"shuffle": True}),
        (view, [random_sample(view_rng, view_rng.randint(5, big), view_rng.randint(0, 9)) for _ in range(2)],
         6, cap, 32, torch.float16, {"view": True}),
    ]
    if runtime.on_gpu():
        bf16, bf16_rng = drawn("bfloat16, head dim 64")
        cases.append((bf16, [random_sample(bf16_rng, bf16_rng.randint(5, big), 7) for _ in range(4)], 8,
                      cap, 64, torch.bfloat16, {}))
    return cases


BAD_MOVES = ("right shift", "duplicate", "src out of range", "negative dst", "counts too large",
             "negative counts", "float src", "src shape", "counts shape")


def bad_moves(change: str, device=None):
    """(src, dst, counts) of two samples' valid moves (5,6,7 -> 2,3,4 and 9,8 -> 3,4 in a
    12-row cache) with one `change` of BAD_MOVES applied: what compact must refuse."""
    src = torch.tensor([[5, 6, 7], [9, 8, 0]], dtype=torch.int32, device=device)
    dst = torch.tensor([[2, 3, 4], [3, 4, 0]], dtype=torch.int32, device=device)
    counts = torch.tensor([3, 2], dtype=torch.int32, device=device)
    if change == "right shift":
        dst[0, 1] = 8  # dst >= src
    elif change == "duplicate":
        dst[1, 1] = 3
    elif change == "src out of range":
        src[1, 0] = 12
    elif change == "negative dst":
        dst[0, 0] = -1
    elif change == "counts too large":
        counts[0] = 4
    elif change == "negative counts":
        counts[1] = -1
    elif change == "float src":
        src = src.float()
    elif change == "src shape":
        src = src[0]
    elif change == "counts shape":
        counts = counts[:1]
    else:
        raise ValueError(f"change must be one of {BAD_MOVES}, got {change!r}")
    return src, dst, counts


def _refusal(module, seed: int, change: str, name: str):
    """Bad moves must raise ValueError naming `name`, leaving the cache unchanged."""
    device = runtime.torch_device()
    cache = inputs.random_tensor((2, 2, 12, 16), seed, torch.float32, device)
    old = cache.clone()
    try:
        module.compact(cache, *bad_moves(change, device))
    except ValueError as error:
        if name not in str(error):
            return f"the ValueError does not name {name}: {error}"
        if not torch.equal(cache, old):
            return "the call was refused, but the cache was modified anyway"
        return ""
    return f"bad moves ({change}) were accepted"


def check_compaction(module, seed: int):
    """module.compact must apply SwiftSpec's compaction moves exactly, in place, overlap-safe."""
    for name, plans_in, rows, capacity, d, dtype, options in compaction_cases(seed):
        label = f"{name}, B={len(plans_in)}, R={rows}, d={d}, {dtype_name(dtype)}"

        def run(plans_in=plans_in, rows=rows, capacity=capacity, d=d, dtype=dtype, options=options,
                label=label):
            problem = _compaction_case(module, plans_in, rows, capacity, d, dtype,
                                       inputs.case_seed(seed, label), **options)
            return CaseResult(label, False, problem) if problem else None
        yield label, run
    for change, name in (("right shift", "dst"), ("duplicate", "dst"), ("src out of range", "src"),
                         ("counts too large", "counts")):
        label = f"bad moves ({change}) -> ValueError naming {name}, cache unchanged"

        def refuse(change=change, name=name, label=label):
            problem = _refusal(module, inputs.case_seed(seed, label), change, name)
            return CaseResult(label, False, problem) if problem else None
        yield label, refuse


# --------------------------------------------------------------------------- attention check


def attention_problem(samples, heads: int, heads_kv: int, width: int, d: int, dtype, seed: int, *,
                      capacity: int | None = None, counts=None, view: bool = False):
    """Random tensors for samples [(prefix_len, parents, query_nodes, row_order or None)];
    returns the keyword arguments of tree_cache_attention plus 'nodes' (per sample, its queries)."""
    device = runtime.torch_device()
    batch = len(samples)
    need = max(p + len(t) for p, t, _, _ in samples)
    capacity = capacity or need + 5
    qs = torch.zeros((batch, width), dtype=torch.int32)
    qe = torch.zeros((batch, width), dtype=torch.int32)
    ks = torch.zeros((batch, capacity), dtype=torch.int32)
    ke = torch.zeros((batch, capacity), dtype=torch.int32)
    for b, (p, parents, nodes, order) in enumerate(samples):
        start, end = pyspec_ref.dfs_times(list(parents)) if parents else ([], [])
        _, kv_s, kv_e = tree_rows(parents, p, capacity, order)
        ks[b], ke[b] = torch.tensor(kv_s), torch.tensor(kv_e)
        for i, v in enumerate(nodes):
            qs[b, i], qe[b, i] = start[v], end[v]
    q = inputs.random_tensor((batch, heads, width, d), seed, dtype, device)
    if view:
        data = inputs.random_tensor((batch, 2 * heads_kv + 2, capacity, d), seed + 1, dtype, device)
        k, v = data[:, 1:1 + heads_kv], data[:, 1 + heads_kv:1 + 2 * heads_kv]
    else:
        k = inputs.random_tensor((batch, heads_kv, capacity, d), seed + 1, dtype, device)
        v = inputs.random_tensor((batch, heads_kv, capacity, d), seed + 2, dtype, device)
    ints = {name: x.to(device) for name, x in (("q_start", qs), ("q_end", qe), ("kv_start", ks),
                                               ("kv_end", ke))}
    prefix = torch.tensor([p for p, _, _, _ in samples], dtype=torch.int32, device=device)
    tree = torch.tensor([len(t) for _, t, _, _ in samples], dtype=torch.int32, device=device)
    kwargs = dict(q=q, k_cache=k, v_cache=v, **ints, prefix_lengths=prefix, tree_lengths=tree)
    if counts is not None:
        kwargs["query_counts"] = torch.tensor(counts, dtype=torch.int32, device=device)
    return kwargs, [list(n) for _, _, n, _ in samples]


def _spec_problem(out, lse, kwargs, samples, b: int, head: int, tolerance) -> str:
    """One (sample, head) against pyspec_ref.kvcache.nonsquare_tree_attention (rows in DFS order)."""
    p, parents, nodes, order = samples[b]
    count = len(nodes) if "query_counts" not in kwargs else int(kwargs["query_counts"][b])
    if count == 0 or not parents:  # the specification needs a tree of at least one node
        return ""
    start, end = pyspec_ref.dfs_times(list(parents))
    group = kwargs["q"].shape[1] // kwargs["k_cache"].shape[1]
    k = kwargs["k_cache"][b, head // group].double().cpu()
    v = kwargs["v_cache"][b, head // group].double().cpu()
    # The specification stores node v at slot p + start[v]: put the rows in that order.
    rows = list(range(p)) + [0] * len(parents)
    slot_of, _, _ = tree_rows(parents, p, k.shape[0], order)
    for node, slot in enumerate(slot_of):
        rows[p + start[node]] = slot
    want, want_lse = spec.nonsquare_tree_attention(
        kwargs["q"][b, head, :count].double().cpu().tolist(), k[rows].tolist(), v[rows].tolist(), start, end,
        nodes[:count], p)
    return (compare_floats(out[b, head, :count].cpu(), torch.tensor(want),
                           f"out (sample {b}, head {head}, vs pyspec_ref)", ("query", "column"), *tolerance)
            or compare_floats(lse[b, head, :count].cpu(), torch.tensor(want_lse),
                              f"lse (sample {b}, head {head}, vs pyspec_ref)", ("query",), *LSE_TOLERANCE))


def _newest(parents, w: int) -> list[int]:
    """The w highest-numbered nodes: the last round of an expansion (the nodes being expanded)."""
    n = len(parents)
    return list(range(max(0, n - w), n))


def attention_cases(seed: int):
    """(name, samples, Hq, Hkv, W, d, dtype, options) of every attention case; a case's random trees
    and queries come from its own seed, `inputs.case_seed(seed, name)`."""
    n = runtime.pick(sim=36, gpu=200)
    prefix = runtime.pick(sim=21, gpu=700)
    w = runtime.pick(sim=5, gpu=32)

    def tree(rng, size, **kw):
        return tuple(inputs.random_tree(size, rng, max_children=rng.randint(1, 4), **kw))

    def sample(p, parents, nodes=None, order=None):
        return (p, parents, tuple(nodes if nodes is not None else _newest(parents, w)), order)

    def shuffled(rng):
        parents = tree(rng, n)
        order = list(range(len(parents)))
        rng.shuffle(order)
        return [sample(prefix, parents, order=order)]

    def anywhere(rng):
        parents = tree(rng, n)
        return [sample(prefix, parents, [rng.randrange(len(parents)) for _ in range(2 * w)])]

    star = tuple(inputs.star(n))
    cases = [  # (name, samples or a function drawing them from the case's rng, Hq, Hkv, W, d, dtype, options)
        ("random trees, the newest w nodes as queries",
         lambda rng: [sample(prefix, tree(rng, n)), sample(prefix // 2, tree(rng, n // 2 + 3))], 2, 2, w, 32,
         torch.float32, {}),
        ("tree rows not in DFS order", shuffled, 2, 2, w, 32, torch.float32, {}),
        ("grouped-query attention (4 heads, 2 KV heads), float16",
         lambda rng: [sample(prefix, tree(rng, n)), sample(3, tree(rng, n // 3 + 2))], 4, 2, w, 64,
         torch.float16, {}),
        ("padding queries (query_counts)",
         lambda rng: [sample(prefix, tree(rng, n)), sample(5, tree(rng, n))], 2, 1, w, 16, torch.float32,
         {"counts": [w - 2, 1]}),
        ("a one-node tree", [sample(prefix, (-1,), [0])], 2, 2, 1, 32, torch.float32, {}),
        ("prefix only (no tree row)", [(prefix + 3, (), (), None)], 2, 2, 3, 32, torch.float32, {}),
        ("empty prefix", lambda rng: [sample(0, tree(rng, n)), sample(prefix, tree(rng, n // 2))], 2, 2, w,
         32, torch.float32, {}),
        ("a star: most tree blocks invisible (skipped)", [sample(prefix, star, [1, n - 1, n - 2])], 2, 2, 3,
         32, torch.float32, {}),
        ("k/v as views data[:, a:b] of one cache, head dim 16",
         lambda rng: [sample(prefix, tree(rng, n)), sample(prefix // 3, tree(rng, n))], 4, 1, w, 16,
         torch.float16, {"view": True}),
        (f"random queries anywhere in the tree, W = {2 * w}", anywhere, 2, 2, 2 * w, 32, torch.float32, {}),
    ]
    if runtime.on_gpu():
        cases.append(("bfloat16, head dim 128", lambda rng: [sample(prefix, tree(rng, n)),
                                                              sample(prefix, tree(rng, n))], 8, 2, w,
                      128, torch.bfloat16, {}))
        cases.append(("a wide verification batch, W = 256",
                      lambda rng: [sample(prefix, tree(rng, 300), list(range(44, 300)))], 4, 2, 256, 32,
                      torch.float16, {}))
    return [(name, samples(random.Random(inputs.case_seed(seed, name))) if callable(samples) else samples,
             *shape) for name, samples, *shape in cases]


def _attention_case(module, samples, heads, heads_kv, width, d, dtype, seed, options) -> str:
    kwargs, _ = attention_problem(samples, heads, heads_kv, width, d, dtype, seed, **options)
    out, lse = module.tree_cache_attention(**kwargs, return_lse=True)
    if not isinstance(out, torch.Tensor) or out.dtype != dtype or lse.dtype != torch.float32:
        got = f"{getattr(out, 'dtype', type(out))} and {getattr(lse, 'dtype', type(lse))}"
        return f"expected out in {dtype_name(dtype)} and lse in float32, got {got}"
    again = module.tree_cache_attention(**kwargs, return_lse=True)
    want, want_lse = kv_oracle.nonsquare_tree_attention(**{k: v for k, v in kwargs.items()})
    tolerance = TOLERANCES[dtype]
    seen = torch.isfinite(want_lse)
    got_lse = torch.where(seen, lse.cpu().double(), 0.0)
    if bool((torch.isfinite(lse.cpu()) != seen).any()):
        where = tuple(int(i) for i in torch.nonzero(torch.isfinite(lse.cpu()) != seen)[0])
        return (f"sample {where[0]}, head {where[1]}, query {where[2]}: lse = {float(lse[where]):.4g}, "
                f"expected {float(want_lse[where]):.4g} (-inf: a padding query, or one that sees no row)")
    problem = compare_floats(out, want, "out", LABELS, *tolerance)
    if problem:
        why = _explain_nonsquare(out, kwargs, samples, tolerance)
        return f"{problem}\n{why}" if why else problem
    return (compare_floats(got_lse, torch.where(seen, want_lse, 0.0), "lse", LSE_LABELS, *LSE_TOLERANCE)
            or _spec_problem(out, lse, kwargs, samples, 0, seed % heads, tolerance)
            or rerun_problem((out, lse), again))


# What the student writes in SwiftSpec's attention and EMS-SD's: the mask (from DFS intervals, or from the
# sample that a binary search restores); the loop over key blocks, its skipping and the online softmax
# are given or another exercise's, so a diagnosis names only a (query, row) pair or a mask rule.
STUDENT_WRITES_THE_MASK = frozenset({MASK_TEST})
NONSQUARE_RULE = "kv_start[row] <= q_start[query] and q_end[query] <= kv_end[row]"


def _explain_nonsquare(out, kwargs, samples, tolerance) -> str:
    """Why a non-square output is wrong (`explain_attention`): the (query, cache row) pair, or the
    interval rule the kernel follows instead, told in nodes and DFS intervals."""
    intervals = [kwargs[name] for name in ("q_start", "q_end", "kv_start", "kv_end", "prefix_lengths",
                                           "tree_lengths")]
    counts, slots = kwargs.get("query_counts"), kwargs["k_cache"].shape[2]
    visible = kv_oracle.nonsquare_mask(*intervals, counts, slots)
    slips = [(kv_oracle.nonsquare_mask(*intervals, counts, slots, ancestor=rule), name)
             for rule, name in MASK_SLIPS]
    group = kwargs["q"].shape[1] // kwargs["k_cache"].shape[1]
    k, v = (kwargs[name].repeat_interleave(group, dim=1) for name in ("k_cache", "v_cache"))
    qs, qe, ks, ke = (x.cpu().tolist() for x in intervals[:4])
    # cache row -> the tree node it holds, per sample
    slots_of = [tree_rows(parents, p, slots, order)[0] if parents else [] for p, parents, _, order in samples]
    node_of = [{slot: node for node, slot in enumerate(slot_of)} for slot_of in slots_of]

    def pair(shown: bool, b: int, query: int, row: int) -> str:
        nodes = samples[b][2]
        node = nodes[query] if query < len(nodes) else "padding"
        asked = f"query {query} (node {node}, [start, end] = [{qs[b][query]}, {qe[b][query]}])"
        if row < int(intervals[4][b]):
            if shown:
                return f"the kernel let {asked} see prefix row {row}, but padding sees nothing"
            return f"the kernel hid prefix row {row} from {asked}, but every query sees the prefix"
        held = (f"cache row {row} (node {node_of[b].get(row, 'none')}, [start, end] = [{ks[b][row]}, "
                f"{ke[b][row]}])")
        if shown:
            return f"the kernel let {asked} see {held}, which is not its ancestor"
        return f"the kernel hid {held} from {asked}, but it is an ancestor-or-self"

    return explain_attention(out, kwargs["q"], k, v, visible, slots, *tolerance, pair=pair,
                             rule=NONSQUARE_RULE, slips=slips, batch="sample", causes=STUDENT_WRITES_THE_MASK)


def reroot_problem(module, prefix_len: int, parents, path, width: int, heads: int, heads_kv: int, d: int,
                   dtype, seed: int) -> str:
    """SwiftSpec §3.2's property: attention after re-rooting + compaction (module.compact) equals
    attention from scratch on the re-rooted tree; '' when it holds (bit for bit)."""
    device = runtime.torch_device()
    parents, path = list(parents), list(path)
    n = len(parents)
    capacity = prefix_len + n + 3
    slot_of, _, _ = tree_rows(parents, prefix_len, capacity)
    r = spec.reroot(parents, path)
    new_prefix, kept = prefix_len + len(r["prefix_nodes"]), r["kept"]
    data = inputs.random_tensor((1, 2 * heads_kv, capacity, d), seed, dtype, device)
    # From scratch: the new prefix = old prefix rows + the committed nodes' rows, then the kept nodes.
    order = list(range(prefix_len)) + [slot_of[v] for v in r["prefix_nodes"]] + [slot_of[v] for v in kept]
    scratch = torch.zeros_like(data)
    scratch[:, :, :len(order)] = data[:, :, torch.tensor(order, device=device)]
    src, dst, counts = module.plan_tensors([spec.compact_plan(prefix_len, parents, path)], device)
    module.compact(data, src, dst, counts)
    queries = [(len(kept) - 1 - i) % len(kept) for i in range(width)]  # new node ids
    _, ks, ke = tree_rows(r["parents"], new_prefix, capacity)
    start, end = r["start"], r["end"]
    common = dict(
        q=inputs.random_tensor((1, heads, width, d), seed + 5, dtype, device),
        q_start=torch.tensor([[start[v] for v in queries]], dtype=torch.int32, device=device),
        q_end=torch.tensor([[end[v] for v in queries]], dtype=torch.int32, device=device),
        kv_start=torch.tensor([ks], dtype=torch.int32, device=device),
        kv_end=torch.tensor([ke], dtype=torch.int32, device=device),
        prefix_lengths=torch.tensor([new_prefix], dtype=torch.int32, device=device),
        tree_lengths=torch.tensor([len(kept)], dtype=torch.int32, device=device),
    )
    after = module.tree_cache_attention(k_cache=data[:, :heads_kv], v_cache=data[:, heads_kv:], **common)
    fresh = module.tree_cache_attention(k_cache=scratch[:, :heads_kv], v_cache=scratch[:, heads_kv:],
                                        **common)
    used = new_prefix + len(kept)
    if not torch.equal(_values_of(data[:, :, :used]), _values_of(scratch[:, :, :used])):
        wrong = (_values_of(data[:, :, :used]) != _values_of(scratch[:, :, :used])).any(dim=3)
        _, row, slot = (int(i) for i in torch.nonzero(wrong)[0])
        return (f"after compaction, stacked row {row}, slot {slot} differs from the re-rooted cache built "
                "from scratch")
    if not torch.equal(after, fresh):
        return ("attention on the compacted cache differs from attention on the re-rooted cache built from "
                "scratch")
    return ""


def check_tree_cache_attention(module, seed: int):
    """module.tree_cache_attention must equal SwiftSpec's non-square tree attention, with its LSE."""
    for name, samples, heads, heads_kv, width, d, dtype, options in attention_cases(seed):
        label = f"{name}, Hq={heads}, Hkv={heads_kv}, W={width}, d={d}, {dtype_name(dtype)}"

        def run(samples=samples, heads=heads, heads_kv=heads_kv, width=width, d=d, dtype=dtype,
                options=options, label=label):
            problem = _attention_case(module, samples, heads, heads_kv, width, d, dtype,
                                      inputs.case_seed(seed, label), options)
            return CaseResult(label, False, problem) if problem else None
        yield label, run

    def overflow():
        name = "prefix + tree past the cache -> ValueError naming tree_lengths"
        kwargs, _ = attention_problem([(4, (-1, 0, 0), (1, 2), None)], 2, 2, 2, 16, torch.float32,
                                      inputs.case_seed(seed, "cache overflow"), capacity=8)
        kwargs["tree_lengths"] = kwargs["tree_lengths"] + 3
        try:
            module.tree_cache_attention(**kwargs)
        except ValueError as error:
            return None if "tree_lengths" in str(error) else CaseResult(
                name, False, f"the ValueError does not name tree_lengths: {error}")
        return CaseResult(name, False, "a tree running past the cache's last row was accepted")
    yield "cache overflow", overflow

    size = runtime.pick(sim=30, gpu=150)
    for i in range(2):
        order = "bfs" if i == 0 else "dfs"
        rng = random.Random(inputs.case_seed(seed, f"re-rooting tree #{i}"))
        parents = inputs.random_tree(size, rng, max_children=3, order=order)
        path = random_root_path(parents, rng, stop=0.1)
        label = (f"re-rooting + compaction == attention from scratch on the re-rooted tree #{i} "
                 f"(N={size}, path of {len(path)})")

        def prop(parents=parents, path=path, label=label, i=i):
            problem = reroot_problem(module, 9 + i, parents, path, 3, 4, 2, 32, torch.float16,
                                     inputs.case_seed(seed, label))
            return CaseResult(label, False, problem) if problem else None
        yield label, prop


# --------------------------------------------------------------------------- EMS-SD (notebook 17)


UNPADDED_LABELS = ("token", "head", "column")
UNPADDED_LSE_LABELS = ("token", "head")


def scattered_layout(counts: list[int], kv_lengths: list[int], seed: int, gap: int = 3):
    """kv_starts placing the samples' regions in a shuffled order with gaps; returns (starts, S)."""
    order = list(range(len(counts)))
    random.Random(seed).shuffle(order)
    starts = [0] * len(counts)
    row = gap
    for b in order:
        starts[b] = row
        row += kv_lengths[b] + counts[b] + gap
    return starts, row


def unpadded_cases(seed: int) -> list[tuple[str, list[int], list[int], int, int, int, torch.dtype]]:
    """(name, counts, kv_lengths, heads, heads_kv, d, dtype) of every case; the random batch is drawn
    from its own seed, `inputs.case_seed(seed, its name)`."""
    many = runtime.pick(sim=8, gpu=64)
    random_batch = f"random batch of {many} samples"
    rng = random.Random(inputs.case_seed(seed, random_batch))
    mixed_counts = [rng.randint(0, 9) for _ in range(many)]
    mixed_counts[0] = max(mixed_counts[0], 1)
    mixed_lengths = [rng.randint(0, runtime.pick(sim=40, gpu=2000)) for _ in range(many)]
    out = [
        ("one sample", [5], [20], 2, 2, 32, torch.float32),
        ("a sample with 0 new tokens", [4, 0, 3], [10, 5, 9], 2, 2, 32, torch.float32),
        ("a sample with KV length 0", [3, 2, 6], [7, 0, 12], 2, 2, 32, torch.float32),
        ("very different lengths", [1, 9, 2], [70, 0, 3], 2, 2, 32, torch.float32),
        ("tiles that straddle samples", [7, 12, 5, 0, 9], [3, 11, 20, 4, 6], 2, 2, 16, torch.float32),
        ("grouped-query attention (4 heads, 2 KV heads)", [3, 6, 2], [9, 4, 17], 4, 2, 32, torch.float16),
        (random_batch, mixed_counts, mixed_lengths, 2, 2, 64, torch.float16),
        ("float16, last sample empty", [6, 3, 0], [12, 30, 8], 2, 1, 64, torch.float16),
    ]
    if runtime.on_gpu():
        out.append(("bfloat16 batch", [4, 1, 8], [100, 7, 300], 4, 2, 128, torch.bfloat16))
    return out


def _unpadded_case_tensors(counts, kv_lengths, heads, heads_kv, d, dtype, seed):
    device = runtime.torch_device()
    starts, slots = scattered_layout(counts, kv_lengths, seed)
    q = inputs.random_tensor((sum(counts), heads, d), seed, dtype, device)
    k = inputs.random_tensor((slots, heads_kv, d), seed + 1, dtype, device)
    v = inputs.random_tensor((slots, heads_kv, d), seed + 2, dtype, device)
    return q, k, v, starts


def _unpadded_spec_problem(out, lse, q, k, v, counts, starts, kv_lengths, head, tolerance) -> str:
    """Compare one head with pyspec_ref.kvcache.unpadded_attention (the specification itself)."""
    group = q.shape[1] // k.shape[1]
    want, want_lse = spec.unpadded_attention(
        q[:, head].double().tolist(), k[:, head // group].double().tolist(),
        v[:, head // group].double().tolist(), counts, starts, kv_lengths)
    return (compare_floats(out[:, head].cpu(), torch.tensor(want), f"out (head {head}, vs pyspec_ref)",
                           ("token", "column"), *tolerance)
            or compare_floats(lse[:, head].cpu(), torch.tensor(want_lse), f"lse (head {head}, vs pyspec_ref)",
                              ("token",), *LSE_TOLERANCE))


def _new_token(counts, t: int) -> tuple[int, int]:
    """(sample, position) of flat token t: new token `position` of sample `sample`."""
    for b, count in enumerate(counts):
        if t < count:
            return b, t
        t -= count
    raise ValueError(f"token {t} is past the batch's {sum(counts)} new tokens")


def _explain_unpadded(out, q, k, v, counts, starts, kv_lengths, tolerance) -> str:
    """Why an unpadded output is wrong: the (token, KV row) pair its mask got wrong
    (`explain_attention`), else which tokens are wrong, told by sample and position (`_wrong_tokens`)."""
    slots = k.shape[0]
    visible = kv_oracle.unpadded_mask(counts, starts, kv_lengths, slots)
    group = q.shape[1] // k.shape[1]
    heads_first = [x.transpose(0, 1).unsqueeze(0) for x in (out, q, k.repeat_interleave(group, dim=1),
                                                            v.repeat_interleave(group, dim=1))]

    def row_of(j: int) -> str:
        for b, (first, cached, count) in enumerate(zip(starts, kv_lengths, counts, strict=True)):
            if first <= j < first + cached:
                return f"cached row {j - first} of sample {b}"
            if first + cached <= j < first + cached + count:
                return f"new token {j - first - cached} of sample {b}"
        return "a row of no sample"

    def token(t: int) -> str:
        b, i = _new_token(counts, t)
        return f"token {t} (new token {i} of sample {b})"

    def pair(shown: bool, _: int, t: int, j: int) -> str:
        if shown:
            return f"the kernel let {token(t)} see KV row {j} ({row_of(j)}), which it must not"
        return f"the kernel hid KV row {j} ({row_of(j)}) from {token(t)}, which it must see"

    return (explain_attention(*heads_first, visible.unsqueeze(0), slots, *tolerance, pair=pair,
                              rule="the rows of its own sample up to itself", batch=None,
                              causes=STUDENT_WRITES_THE_MASK)
            or _wrong_tokens(*heads_first, counts, starts, kv_lengths, visible, tolerance, token))


def _wrong_tokens(out, q, k, v, counts, starts, kv_lengths, visible, tolerance, token) -> str:
    """Which tokens are wrong, by sample and position: the first, with the rows it must see; and
    whether every wrong token is the first of its sample (t == offsets[b]: the search's bound)."""
    atol, rtol = tolerance
    out, q, k, v = (x.detach().cpu().double()[0] for x in (out, q, k, v))  # (H, T, d), (H, S, d)
    right = attention_with_lse(q, k, v, visible.unsqueeze(0))[0]
    wrong = [int(t) for t in torch.nonzero(((out - right).abs() > atol + rtol * right.abs()).any(-1).any(0))]
    if not wrong:
        return ""
    b, i = _new_token(counts, wrong[0])
    first, cached = starts[b], kv_lengths[b]
    text = (f"{token(wrong[0])} must see KV rows {first} to {first + cached + i}: the {cached} cached rows "
            f"of sample {b}, then its new tokens 0 to {i}")
    if all(_new_token(counts, t)[1] == 0 for t in wrong):
        text += (f"; every wrong token ({', '.join(map(str, wrong[:6]))}) is the first new token of its "
                 "sample, t == offsets[b] (is the search's test offsets[mid] <= t?)")
    return text


def check_unpadded_attention(module, seed: int):
    """module.unpadded_attention must equal EMS-SD's per-sample causal attention, with its LSE."""
    for index, (name, counts, kv_lengths, heads, heads_kv, d, dtype) in enumerate(unpadded_cases(seed)):
        label = f"{name}, counts={counts if len(counts) <= 8 else '...'}, d={d}, {dtype_name(dtype)}"

        def run(label=label, counts=counts, kv_lengths=kv_lengths, heads=heads, heads_kv=heads_kv, d=d,
                dtype=dtype, index=index):
            q, k, v, starts = _unpadded_case_tensors(counts, kv_lengths, heads, heads_kv, d, dtype,
                                                     inputs.case_seed(seed, label))
            out, lse = module.unpadded_attention(q, k, v, counts, starts, kv_lengths, return_lse=True)
            if not isinstance(out, torch.Tensor) or out.dtype != dtype or lse.dtype != torch.float32:
                got = f"{getattr(out, 'dtype', type(out))} and {getattr(lse, 'dtype', type(lse))}"
                return CaseResult(label, False, f"expected out in {dtype_name(dtype)} and lse in float32, "
                                                f"got {got}")
            again = module.unpadded_attention(q, k, v, counts, starts, kv_lengths, return_lse=True)
            want, want_lse = kv_oracle.unpadded_attention(q, k, v, counts, starts, kv_lengths)
            tolerance = TOLERANCES[dtype]
            problem = compare_floats(out, want, "out", UNPADDED_LABELS, *tolerance)
            if problem:
                why = _explain_unpadded(out, q, k, v, counts, starts, kv_lengths, tolerance)
                return CaseResult(label, False, f"{problem}\n{why}" if why else problem)
            problem = (compare_floats(lse, want_lse, "lse", UNPADDED_LSE_LABELS, *LSE_TOLERANCE)
                       or _unpadded_spec_problem(out, lse, q, k, v, counts, starts, kv_lengths, index % heads,
                                        tolerance)
                       or rerun_problem((out, lse), again))
            return CaseResult(label, False, problem) if problem else None
        yield label, run

    def refuses_bad_counts():
        name = "counts that don't add up to q's rows -> ValueError naming counts"
        q, k, v, starts = _unpadded_case_tensors([3, 2], [4, 5], 2, 2, 16, torch.float32,
                                                 inputs.case_seed(seed, "counts that don't add up"))
        try:
            module.unpadded_attention(q, k, v, [3, 3], starts, [4, 5])
        except ValueError as error:
            if "counts" in str(error):
                return None
            return CaseResult(name, False, f"the ValueError does not name counts: {error}")
        return CaseResult(name, False, "counts [3, 3] for 5 rows of q were accepted")
    yield "counts that don't add up", refuses_bad_counts
