"""Argument checks of the KV-cache launchers: SwiftSpec (notebook 18) and EMS-SD (notebook 17).

Every message names the argument. The launchers of `solutions/swiftspec.py` and
`solutions/emssd.py` and the `prepare_*` launchers of `course.topics.kvcache.launch` call these
before they launch a kernel, so a wrong shape, a move out of range or two samples sharing cache
rows fail on the host with a clear message instead of corrupting the cache on the GPU. The
checked results (`Moves`, `CacheBatch`, `Batch`) hold the index tensors the kernels read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course.core import runtime
from course.core.validate import require_interpretable_dtype, require_kv_heads, require_like_q, require_tensor

HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_GRID_YZ = 65535  # CUDA's limit on the second and third grid dimensions
INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------- shared


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _kernel_device_tensor(value, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    wanted = runtime.torch_device().type
    if value.device.type != wanted:
        where = "the simulator runs on CPU tensors" if runtime.SIMULATOR else "kernels run on the GPU"
        raise ValueError(f"{name} must be on device '{wanted}' ({where}), got '{value.device}'")
    return value


def _index_tensor(value, name: str, shape: tuple[int, ...], device, note: str) -> torch.Tensor:
    """An int32/int64 tensor (or, for 1-D, a list of ints) of `shape`, as contiguous int32 on device."""
    if not isinstance(value, torch.Tensor):
        if len(shape) == 1 and isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            for i, x in enumerate(value):
                if isinstance(x, bool) or not isinstance(x, int):
                    raise TypeError(f"{name}[{i}] must be an int, got {x!r}")
            value = torch.tensor(list(value), dtype=torch.int64, device=device)
        else:
            raise TypeError(f"{name} must be an int32 tensor of shape {shape} ({note}), "
                            f"got {type(value).__name__}")
    if value.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be an int32 (or int64) tensor, got {_dtype_name(value.dtype)}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ({note}), got {tuple(value.shape)}")
    if value.device != torch.device(device) and value.device.type != torch.device(device).type:
        raise ValueError(f"{name} must be on the cache's device {device}, got {value.device}")
    if value.dtype == torch.int64 and value.numel() and (value.abs().max() > INT32_MAX):
        raise ValueError(f"{name} has entries beyond the int32 range")
    return value.to(device=device, dtype=torch.int32).contiguous()


def _first(flags: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(flags)[0])


# --------------------------------------------------------------------------- SwiftSpec: compaction


@dataclass(frozen=True)
class Moves:
    """Checked moves of one compaction: per sample, the first counts[b] (src, dst) pairs, sorted by dst."""

    src: torch.Tensor  # (B, M) int32, sorted by dst within each sample's valid entries
    dst: torch.Tensor  # (B, M) int32
    counts: torch.Tensor  # (B,) int32
    total: int  # sum(counts): rows moved per stacked row


def check_moves(cache, src, dst, counts) -> Moves:
    """Check a compaction's arguments (nothing is written); errors name the argument.

    cache: a 4-D (B, R, C, d) float tensor on the kernel device (any strides); src, dst: int32/int64
    (B, M); counts: (B,) with 0 <= counts[b] <= M. The first counts[b] moves of sample b must have
    0 <= dst < src < C (every move shifts left) and distinct destinations.
    """
    _kernel_device_tensor(cache, "cache")
    if cache.dim() != 4:
        raise ValueError(f"cache must have 4 dimensions (B, R, C, d), got shape {tuple(cache.shape)}")
    if not cache.is_floating_point():
        raise TypeError(f"cache must be a floating-point tensor, got {_dtype_name(cache.dtype)}")
    if cache.numel() == 0:
        raise ValueError(f"cache must not be empty, got shape {tuple(cache.shape)}")
    batch, rows, slots, d = cache.shape
    if rows > 2**31 - 1 or batch > MAX_GRID_YZ:
        raise ValueError(f"cache has B = {batch} samples; the launch grid allows at most {MAX_GRID_YZ}")
    for name, value in (("src", src), ("dst", dst)):
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[0] == batch:
            continue
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{name} must be a (B, M) = ({batch}, M) int tensor of slots, got {shape}")
    width = src.shape[1]
    device = cache.device
    s = _index_tensor(src, "src", (batch, width), device, "B samples x M moves")
    t = _index_tensor(dst, "dst", (batch, width), device, "like src")
    c = _index_tensor(counts, "counts", (batch,), device, "one count of moves per sample")
    bad = (c < 0) | (c > width)
    if bool(bad.any()):
        b = _first(bad)[0]
        raise ValueError(f"counts[{b}] = {int(c[b])} must be in [0, M = {width}] (the moves src/dst "
                         "hold per sample): counts inconsistent with src")
    live = torch.arange(width, device=device)[None, :] < c[:, None]
    for name, value in (("src", s), ("dst", t)):
        bad = live & ((value < 0) | (value >= slots))
        if bool(bad.any()):
            b, m = _first(bad)
            raise ValueError(f"{name}[{b}, {m}] = {int(value[b, m])} is out of range: the cache has "
                             f"C = {slots} slots (KV position out of range)")
    bad = live & (t >= s)
    if bool(bad.any()):
        b, m = _first(bad)
        raise ValueError(f"dst[{b}, {m}] = {int(t[b, m])} >= src[{b}, {m}] = {int(s[b, m])}: every move "
                         "of SwiftSpec's compaction shifts a row left (dst < src)")
    key = torch.where(live, t, slots)  # padding sorts last
    key, order = torch.sort(key, dim=1, stable=True)
    clash = live[:, 1:] & (key[:, 1:] == key[:, :-1])
    if bool(clash.any()):
        b, m = _first(clash)
        first, second = int(order[b, m]), int(order[b, m + 1])
        raise ValueError(f"dst[{b}, {first}] and dst[{b}, {second}] are both slot {int(key[b, m])}: "
                         "duplicate destinations (one row would be lost)")
    s_sorted = torch.gather(s, 1, order).contiguous()
    t_sorted = torch.where(live, key, 0).to(torch.int32).contiguous()
    return Moves(s_sorted, t_sorted, c, int(c.sum()))


def compact_plans(plans, width: int | None = None) -> tuple[list[list[tuple[int, int]]], int]:
    """Check `pyspec_ref.kvcache.compact_plan` outputs, one list of (src, dst) per sample, and the
    padded width M (None: the longest plan, at least 1); return (the pairs as ints, M)."""
    if isinstance(plans, (str, bytes)) or not isinstance(plans, Sequence) or not plans:
        raise ValueError("plans must be a non-empty list with one list of (src, dst) moves per sample")
    rows = []
    for b, plan in enumerate(plans):
        if isinstance(plan, (str, bytes)) or not isinstance(plan, Sequence):
            raise TypeError(f"plans[{b}] must be a list of (src, dst) pairs, got {type(plan).__name__}")
        pairs = []
        for m, pair in enumerate(plan):
            if not isinstance(pair, Sequence) or len(pair) != 2 or any(
                    isinstance(x, bool) or not isinstance(x, int) for x in pair):
                raise TypeError(f"plans[{b}][{m}] must be a (src, dst) pair of ints, got {pair!r}")
            pairs.append((int(pair[0]), int(pair[1])))
        rows.append(pairs)
    longest = max(1, max(len(r) for r in rows))
    if width is None:
        width = longest
    elif isinstance(width, bool) or not isinstance(width, int) or width < longest:
        raise ValueError(f"width must be an int >= the longest plan ({longest} moves), got {width!r}")
    return rows, width


# --------------------------------------------------------------------------- SwiftSpec: attention


@dataclass(frozen=True)
class CacheBatch:
    """A checked call of `tree_cache_attention`: the index tensors as contiguous int32 on q's device."""

    q_start: torch.Tensor
    q_end: torch.Tensor
    kv_start: torch.Tensor
    kv_end: torch.Tensor
    prefix_lengths: torch.Tensor
    tree_lengths: torch.Tensor
    query_counts: torch.Tensor


def _check_cache_tensor(value, name: str, q: torch.Tensor) -> None:
    _kernel_device_tensor(value, name)
    if value.dim() != 4:
        raise ValueError(f"{name} must have 4 dimensions (B, H_kv, C, d), got shape {tuple(value.shape)}")
    require_like_q(value, name, q)
    if value.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(value.shape)}")


def check_attention_inputs(q, k_cache, v_cache, q_start, q_end, kv_start, kv_end, prefix_lengths,
                           tree_lengths, query_counts=None) -> CacheBatch:
    """Check `tree_cache_attention`'s arguments; every error names the argument.

    The caches are not scanned for NaN (unused capacity may hold anything; only rows [0, P + T) of a
    sample are read). q is checked for NaN on its real (non-padding) queries only.
    """
    _kernel_device_tensor(q, "q")
    if q.dim() != 4:
        raise ValueError(f"q must have 4 dimensions (B, H, W, d), got shape {tuple(q.shape)}")
    if q.dtype not in DTYPES:
        raise TypeError(f"q must have dtype float16, bfloat16 or float32, got {_dtype_name(q.dtype)}")
    require_interpretable_dtype(q, "q")
    if q.numel() == 0:
        raise ValueError(f"q must not be empty, got shape {tuple(q.shape)}")
    _check_cache_tensor(k_cache, "k_cache", q)
    _check_cache_tensor(v_cache, "v_cache", q)
    batch, heads, width, d = q.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"q's head dimension (last axis) must be one of {HEAD_DIMS}, got {d}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    kb, heads_kv, slots, kd = k_cache.shape
    if kb != batch:
        raise ValueError(f"k_cache holds {kb} samples, but q holds B = {batch}")
    require_kv_heads(heads, d, "k_cache", heads_kv, kd)
    if heads_kv > MAX_GRID_YZ or batch > MAX_GRID_YZ:
        raise ValueError(f"B = {batch} and H_kv = {heads_kv} must be at most {MAX_GRID_YZ} (launch grid)")
    if slots * max(k_cache.stride(2), v_cache.stride(2), 1) >= 2**31:
        raise ValueError(f"the cache's C = {slots} slots are too many for 32-bit row offsets")
    for name, value in (("k_cache", k_cache), ("v_cache", v_cache)):
        if value.stride(3) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous (stride 1), got stride "
                             f"{value.stride(3)} (views data[:, a:b] of a (B, R, C, d) cache are fine)")
    device = q.device
    qs = _index_tensor(q_start, "q_start", (batch, width), device, "B x W: each query's DFS start")
    qe = _index_tensor(q_end, "q_end", (batch, width), device, "B x W: each query's DFS end")
    ks = _index_tensor(kv_start, "kv_start", (batch, slots), device, "B x C: each cache row's DFS start")
    ke = _index_tensor(kv_end, "kv_end", (batch, slots), device, "B x C: each cache row's DFS end")
    p = _index_tensor(prefix_lengths, "prefix_lengths", (batch,), device, "one prefix length per sample")
    t = _index_tensor(tree_lengths, "tree_lengths", (batch,), device, "one tree length per sample")
    if query_counts is None:
        c = torch.full((batch,), width, dtype=torch.int32, device=device)
    else:
        c = _index_tensor(query_counts, "query_counts", (batch,), device, "real queries per sample")
    queries = torch.arange(width, device=device)[None, :] < c[:, None]
    rows = torch.arange(slots, device=device)[None, :]
    tree = (rows >= p[:, None]) & (rows < (p + t)[:, None])
    nan_q = (~torch.isfinite(q)).any(dim=3).any(dim=1) & queries
    checks = [
        ("prefix_lengths", p < 0, "must be >= 0"),
        ("tree_lengths", t < 0, "must be >= 0"),
        ("query_counts", (c < 0) | (c > width), f"must be in [0, W = {width}]"),
        ("tree_lengths", (p + t) > slots,
         f"plus prefix_lengths exceeds the cache's C = {slots} slots: cache overflow (KV position out of "
         "range)"),
        ("q_start", queries & (qs < 0), "must be >= 0 (a DFS time)"),
        ("q_end", queries & (qe < qs), "must be >= q_start (a node's interval is [start, end])"),
        ("kv_start", tree & (ks < 0), "must be >= 0 (a DFS time) on tree rows"),
        ("kv_end", tree & (ke < ks), "must be >= kv_start on tree rows (a node's interval is [start, end])"),
        # DFS times of a tree of T nodes lie in [0, T): a larger one would silently change what a
        # query sees, since the kernel only compares times (T = 0: a prefix-only sample, no tree).
        ("q_end", queries & (t[:, None] > 0) & (qe >= t[:, None]),
         "must be < tree_lengths (a DFS time of the sample's tree)"),
        ("kv_end", tree & (ke >= t[:, None]), "must be < tree_lengths on tree rows (a DFS time)"),
    ]
    values = {"prefix_lengths": p, "tree_lengths": t, "query_counts": c, "q_start": qs, "q_end": qe,
              "kv_start": ks, "kv_end": ke}
    flags = torch.stack([bad.any() for _, bad, _ in checks] + [nan_q.any()]).tolist()  # one sync
    for (name, bad, what), flagged in zip(checks, flags, strict=False):
        if flagged:
            where = _first(bad)
            label = ", ".join(map(str, where))
            raise ValueError(f"{name}[{label}] = {int(values[name][where])} {what}")
    if flags[-1]:
        b, i = _first(nan_q)
        raise ValueError(f"q contains NaN or infinite values in a real query (sample {b}, query {i})")
    return CacheBatch(qs, qe, ks, ke, p, t, c)


def same_cache_layout(checked, q, k_cache, v_cache) -> CacheBatch:
    """`checked` if it is a CacheBatch whose layout these tensors can have (a cheap check, no sync)."""
    if not isinstance(checked, CacheBatch):
        raise TypeError(f"checked must be a CacheBatch from check_attention_inputs, got "
                        f"{type(checked).__name__}")
    if (tuple(checked.q_start.shape) != (q.shape[0], q.shape[2]) or k_cache.shape != v_cache.shape
            or tuple(checked.kv_start.shape) != (k_cache.shape[0], k_cache.shape[2])):
        raise ValueError(f"checked was made for queries {tuple(checked.q_start.shape)} and cache rows "
                         f"{tuple(checked.kv_start.shape)}; q has {tuple(q.shape)}, k_cache "
                         f"{tuple(k_cache.shape)}: call without checked=")
    return checked


# --------------------------------------------------------------------------- EMS-SD


def _sample_ints(value, name: str, device) -> torch.Tensor:
    """A 1-D int list/tensor as a CPU int64 tensor (checked: ints, non-empty)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype not in INDEX_DTYPES:
            raise TypeError(f"{name} must be a 1-D int32/int64 tensor or a list of ints, got a "
                            f"{value.dim()}-D {str(value.dtype).replace('torch.', '')} tensor")
        if value.device.type != torch.device(device).type:
            raise ValueError(f"{name} must be on q's device {device}, got {value.device}")
        items = value.detach().cpu().long()
    else:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise TypeError(f"{name} must be a list of ints or a 1-D int tensor, got {type(value).__name__}")
        for i, x in enumerate(value):
            if isinstance(x, bool) or not isinstance(x, int):
                raise TypeError(f"{name}[{i}] must be an int, got {x!r}")
        items = torch.tensor(list(value), dtype=torch.int64)
    if items.numel() == 0:
        raise ValueError(f"{name} must not be empty: a batch has at least one sample")
    bad = torch.nonzero(items < 0)
    if len(bad):
        i = int(bad[0, 0])
        raise ValueError(f"{name}[{i}] = {int(items[i])} must be >= 0")
    return items


@dataclass(frozen=True)
class Batch:
    """A checked unpadded batch: the per-sample bookkeeping, on the host and on q's device."""

    counts: list[int]
    kv_starts: list[int]
    kv_lengths: list[int]
    offsets: torch.Tensor  # (B + 1,) int32 on q's device: exclusive prefix sums of counts
    starts: torch.Tensor  # (B,) int32
    lengths: torch.Tensor  # (B,) int32

    @property
    def size(self) -> int:
        return len(self.counts)


def check_batch(q, k_cache, v_cache, counts, kv_starts, kv_lengths) -> Batch:
    """Check q (T, H, d), the cache (S, H_kv, d) and the bookkeeping; clear errors naming the argument.

    Refused: wrong ranks/dtypes/devices, NaN, head dims outside HEAD_DIMS, H not a multiple of
    H_kv, counts not adding up to T, per-sample lists of different lengths, negative entries, a
    sample region [start, start + length + count) past the cache or overlapping another's.
    """
    require_tensor(q, "q", ndim=3, dtypes=DTYPES)
    require_interpretable_dtype(q, "q")
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache)):
        require_tensor(tensor, name, ndim=3, dtypes=DTYPES)
        require_like_q(tensor, name, q)
    total, heads, d = q.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"q's head dimension (last axis) must be one of {HEAD_DIMS}, got {d}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} "
                         f"and {tuple(v_cache.shape)}")
    slots, heads_kv, d_kv = k_cache.shape
    require_kv_heads(heads, d, "k_cache", heads_kv, d_kv)
    c = _sample_ints(counts, "counts", q.device)
    starts = _sample_ints(kv_starts, "kv_starts", q.device)
    lengths = _sample_ints(kv_lengths, "kv_lengths", q.device)
    for name, items in (("kv_starts", starts), ("kv_lengths", lengths)):
        if items.numel() != c.numel():
            raise ValueError(f"{name} has {items.numel()} entries, expected B = {c.numel()} "
                             "(one per sample, like counts)")
    if int(c.sum()) != total:
        raise ValueError(f"counts add up to {int(c.sum())}, but q has T = {total} rows (tokens): the "
                         "concatenated inputs must hold exactly sum(counts) tokens")
    ends = starts + lengths + c
    over = torch.nonzero(ends > slots)
    if len(over):
        b = int(over[0, 0])
        raise ValueError(f"sample {b}'s KV region [{int(starts[b])}, {int(ends[b])}) (kv_starts + "
                         f"kv_lengths + counts) runs past the end of the cache ({slots} rows): KV "
                         "position out of range")
    live = torch.nonzero(ends > starts).flatten()
    order = live[torch.argsort(starts[live], stable=True)]
    clash = torch.nonzero(starts[order[1:]] < ends[order[:-1]]).flatten()
    if len(clash):
        b0, b1 = int(order[clash[0]]), int(order[clash[0] + 1])
        raise ValueError(f"the KV regions of samples {b0} [{int(starts[b0])}, {int(ends[b0])}) and {b1} "
                         f"[{int(starts[b1])}, {int(ends[b1])}) overlap: each sample must own its rows "
                         "of the cache")
    if c.numel() > 2**20 or slots >= 2**31:
        raise ValueError("the batch must have fewer than 2**20 samples and the cache fewer than 2**31 rows")
    offsets = torch.zeros(c.numel() + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(c, 0)
    device = q.device
    return Batch(c.tolist(), starts.tolist(), lengths.tolist(),
                 offsets.to(device=device, dtype=torch.int32), starts.to(device=device, dtype=torch.int32),
                 lengths.to(device=device, dtype=torch.int32))


def same_layout(checked, q, k_cache, v_cache) -> Batch:
    """`checked` if it is a Batch whose layout these tensors can have (a cheap check, no sync)."""
    if not isinstance(checked, Batch):
        raise TypeError(f"checked must be a Batch from check_batch, got {type(checked).__name__}")
    if q.shape[0] != sum(checked.counts) or k_cache.shape != v_cache.shape or q.dtype != k_cache.dtype:
        raise ValueError(f"checked was made for a batch of {sum(checked.counts)} tokens; q has "
                         f"{tuple(q.shape)}, k_cache {tuple(k_cache.shape)}: call without checked=")
    return checked
