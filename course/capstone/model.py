"""TinyLM: the capstone's decoder-only transformer, in plain PyTorch (no kernels imported here).

The same class serves as target and draft; only the `ModelConfig` differs. Each block is the
Llama recipe at toy size: RMSNorm before attention and before the MLP, rotary position embeddings
(RoPE) on queries and keys, grouped-query attention (GQA: `n_heads` query heads share `n_kv_heads`
key/value heads, query head h reading KV head h // (n_heads // n_kv_heads), the convention of the
course's kernels) and a SwiGLU MLP; the output projection is the embedding table (tied).

Two paths compute the same function:
- `forward(tokens)`: the whole sequence at once with a causal mask (training, and the reference).
- `step(tokens, positions, cache, rows, attend)`: W new tokens against a KV cache. The model computes
  q, k, v, writes k and v into the cache rows the caller chose and hands q and the cache to `attend`,
  a callable built by the decoder. The model knows nothing about masks or trees: which cached row a
  query may see (a causal prefix, a token tree, a padded batch) is `attend`'s business, so the same
  model runs plain decoding, draft expansion and tree verification.
Attention scale: `attend` must use 1 / sqrt(head_dim) (the kernels' default scale).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import model_kernels

ROPE_BASE = 10000.0


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of one TinyLM. head_dim = d_model // n_heads (32 for the small pair, 16 for tiny)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    max_positions: int
    ff_mult: int = 4

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "max_positions",
                     "ff_mult"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"ModelConfig.d_model ({self.d_model}) must be a multiple of n_heads "
                             f"({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                             f"({self.n_kv_heads}) (grouped-query attention)")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig: head_dim ({self.head_dim}) must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def ff_dim(self) -> int:
        return self.ff_mult * self.d_model

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class KVCache:
    """The keys and values of every layer in ONE tensor, so one compaction moves all layers at once.

    data: (B, n_layers * 2 * n_kv_heads, capacity + 1, head_dim); for layer l, channels
    [2l * Hkv, (2l + 1) * Hkv) hold the keys and [(2l + 1) * Hkv, (2l + 2) * Hkv) the values.
    `k(l)`, `v(l)` and `kv(l)` (both) are views (no copies): writing into them writes into `data`,
    and moving rows of `data` moves them. Row `capacity` (the last) is scratch: a padding query's key
    and value are written there, so that a step writes every query's row without a branch or a
    boolean mask (a CUDA graph needs the same kernels whatever the batch holds); nothing reads it.
    """

    def __init__(self, data: Tensor, n_layers: int, n_kv_heads: int):
        if not isinstance(data, Tensor) or data.dim() != 4:
            raise ValueError(f"data must be a 4-D tensor (B, n_layers*2*n_kv_heads, capacity + 1, head_dim), "
                             f"got {getattr(data, 'shape', type(data))}")
        if data.shape[1] != n_layers * 2 * n_kv_heads:
            raise ValueError(f"data.shape[1] must be n_layers * 2 * n_kv_heads = {n_layers * 2 * n_kv_heads},"
                             f" got {data.shape[1]}")
        if data.shape[2] < 2:
            raise ValueError(f"data must hold at least one row and the scratch row, got {data.shape[2]} rows")
        self.data = data
        self.n_layers = n_layers
        self.n_kv_heads = n_kv_heads

    def _check_layer(self, layer: int):
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}), got {layer}")

    def k(self, layer: int) -> Tensor:
        self._check_layer(layer)
        h = self.n_kv_heads
        return self.data[:, 2 * layer * h:(2 * layer + 1) * h]

    def v(self, layer: int) -> Tensor:
        self._check_layer(layer)
        h = self.n_kv_heads
        return self.data[:, (2 * layer + 1) * h:(2 * layer + 2) * h]

    def kv(self, layer: int) -> Tensor:
        """Layer `layer`'s keys and values together, (B, 2 * Hkv, capacity + 1, head_dim)."""
        self._check_layer(layer)
        h = self.n_kv_heads
        return self.data[:, 2 * layer * h:(2 * layer + 2) * h]

    @property
    def batch(self) -> int:
        return self.data.shape[0]

    @property
    def capacity(self) -> int:
        """Rows a sample may use; row `capacity` is the scratch row."""
        return self.data.shape[2] - 1

    @property
    def scratch_row(self) -> int:
        return self.data.shape[2] - 1

    @property
    def head_dim(self) -> int:
        return self.data.shape[3]

    def __repr__(self):
        return (f"KVCache(batch={self.batch}, layers={self.n_layers}, kv_heads={self.n_kv_heads}, "
                f"capacity={self.capacity}, head_dim={self.head_dim}, dtype={self.data.dtype})")


class RMSNorm(nn.Module):
    """x / rms(x) * weight (Zhang & Sennrich 2019): no mean subtraction, no bias. `F.rms_norm`: one
    fused kernel on a GPU, which sums the squares in float32 even for fp16/bf16 inputs."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight.to(x.dtype), self.eps)


def rope_angles(positions: Tensor, head_dim: int) -> tuple[Tensor, Tensor]:
    """cos and sin of RoPE's angles (Su et al. 2021, RoFormer §3.4.2) for integer positions (B, T):
    pair i of a head rotates by position * base^(-2i / head_dim). Returns two (B, 1, T, head_dim / 2)
    float32 tensors, broadcast over heads. Computed from the positions themselves, not a table, so
    any position order (a token tree's depths) works."""
    inv_freq = ROPE_BASE ** (-torch.arange(0, head_dim, 2, device=positions.device,
                                           dtype=torch.float32) / head_dim)
    angles = positions.float()[..., None] * inv_freq  # (B, T, hd/2)
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x[i], x[i + hd/2]) of x (B, H, T, hd) by its angle ("rotate half" layout).
    The dot product of a rotated query and key then depends only on their position difference."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return rotated.to(x.dtype)


class Attention(nn.Module):
    """Projections of grouped-query attention; the attention itself is forward's SDPA or step's
    `attend`."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        hd = config.head_dim
        self.q_proj = nn.Linear(config.d_model, config.n_heads * hd, bias=False)
        self.kv_proj = nn.Linear(config.d_model, 2 * config.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.n_heads * hd, config.d_model, bias=False)

    def qkv(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, Hq, T, hd), k and v (B, Hkv, T, hd), q and k rotated to their positions."""
        c = self.config
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k, v = self.kv_proj(x).view(B, T, 2, c.n_kv_heads, c.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = rope_angles(positions, c.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def merge(self, out: Tensor) -> Tensor:
        """(B, Hq, T, hd) attention output -> (B, T, d_model) through the output projection."""
        B, H, T, hd = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * hd))


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up = nn.Linear(config.d_model, 2 * config.ff_dim, bias=False)
        self.down = nn.Linear(config.ff_dim, config.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.d_model)
        self.mlp = MLP(config)


def _extremes(*tensors: Tensor) -> list[int]:
    """[min, max] of each tensor, fetched with one device-to-host copy (one wait for the GPU)."""
    return torch.stack([f(t).long() for t in tensors for f in (torch.min, torch.max)]).tolist()


def _check_range(name: str, lo: int, hi: int, start: int, stop: int):
    if lo < start or hi >= stop:
        raise ValueError(f"{name} must be in [{start}, {stop}), got values in [{lo}, {hi}]")


def causal_attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal GQA attention of q (B, Hq, T, hd) over k, v (B, Hkv, T, hd) with SDPA."""
    group = q.shape[1] // k.shape[1]
    if group > 1:  # query head h reads KV head h // group
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class TinyLM(nn.Module):
    """A decoder-only transformer; see the module docstring. Random init from a config; trained
    weights come from `course.capstone.weights.load_pair`."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ValueError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        # `step` runs RoPE and SwiGLU as one Triton kernel each (`model_kernels`) on a GPU; None: when
        # the model is on CUDA outside the simulator. The torch statement stays the CPU's.
        self.fused_elementwise: bool | None = None
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = RMSNorm(config.d_model)
        self.reset_parameters()

    def reset_parameters(self, seed: int | None = None):
        """GPT-2 style init: N(0, 0.02), projections into the residual stream scaled down by
        sqrt(2 * n_layers) so the residual's variance does not grow with depth."""
        gen = None
        if seed is not None:
            gen = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                    continue
                std = residual_std if name.endswith(("o_proj.weight", "down.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=gen) * std)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def _logits(self, x: Tensor) -> Tensor:
        return (self.final_norm(x) @ self.embed.weight.t()).float()

    def _check_tokens(self, tokens: Tensor, values: bool = True):
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype not in (torch.int32,
                                                                                       torch.int64):
            got = f"{getattr(tokens, 'dtype', type(tokens))} {tuple(getattr(tokens, 'shape', ()))}"
            raise ValueError(f"tokens must be an int32/int64 tensor (B, T), got {got}")
        if values and tokens.numel():
            _check_range("tokens", *_extremes(tokens), 0, self.config.vocab_size)

    def forward(self, tokens: Tensor, *, validate: bool = True) -> Tensor:
        """Logits (B, T, V) float32 of the next token after each prefix tokens[:, :t + 1]: the causal
        training and reference path (positions 0..T-1). validate=False skips the check of the token
        values, which waits for the GPU (training passes its own, known-good batches)."""
        self._check_tokens(tokens, values=validate)
        B, T = tokens.shape
        if T > self.config.max_positions:
            raise ValueError(f"tokens: sequence length {T} exceeds max_positions "
                             f"{self.config.max_positions}")
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        x = self.embed(tokens.long())
        for block in self.blocks:
            q, k, v = block.attn.qkv(block.attn_norm(x), positions)
            x = x + block.attn.merge(causal_attend(q, k, v))
            x = x + block.mlp(block.mlp_norm(x))
        return self._logits(x)

    def new_cache(self, batch: int, capacity: int, device=None, dtype=None) -> KVCache:
        """An empty (zeroed) KV cache of `capacity` rows per sample (and the scratch row); by default
        on the model's device and in its dtype."""
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        c = self.config
        data = torch.zeros(batch, c.n_layers * 2 * c.n_kv_heads, capacity + 1, c.head_dim,
                           device=device if device is not None else self.device,
                           dtype=dtype if dtype is not None else self.dtype)
        return KVCache(data, c.n_layers, c.n_kv_heads)

    def workspace(self, batch: int, width: int) -> Workspace:
        """The buffer a step of `width` new tokens per sample projects into (see `Workspace`)."""
        return Workspace(self.config, batch, width, self.device, self.dtype)

    def _check_step(self, tokens: Tensor, positions: Tensor, cache: KVCache, rows: Tensor):
        c = self.config
        self._check_tokens(tokens, values=False)
        for name, t in (("positions", positions), ("rows", rows)):
            if not isinstance(t, Tensor) or t.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"{name} must be an int32/int64 tensor, got {type(t).__name__} "
                                 f"{getattr(t, 'dtype', '')}")
            if t.shape != tokens.shape:
                raise ValueError(f"{name} must have the shape of tokens {tuple(tokens.shape)}, "
                                 f"got {tuple(t.shape)}")
            if t.device != tokens.device:
                raise ValueError(f"{name} must be on tokens' device {tokens.device}, got {t.device}")
        if not isinstance(cache, KVCache):
            raise ValueError(f"cache must be a KVCache (from new_cache), got {type(cache).__name__}")
        if (cache.n_layers, cache.n_kv_heads, cache.head_dim) != (c.n_layers, c.n_kv_heads, c.head_dim):
            raise ValueError(f"cache has layers/kv_heads/head_dim {cache.n_layers}/{cache.n_kv_heads}/"
                             f"{cache.head_dim}, the model {c.n_layers}/{c.n_kv_heads}/{c.head_dim}")
        if cache.batch != tokens.shape[0]:
            raise ValueError(f"cache has batch {cache.batch}, tokens {tokens.shape[0]}")
        if cache.data.device != tokens.device:
            raise ValueError(f"cache is on {cache.data.device}, tokens on {tokens.device}")
        if tokens.numel():  # one transfer from the device for all the value checks
            t_lo, t_hi, p_lo, p_hi, _, r_hi = _extremes(tokens, positions, rows)
            _check_range("tokens", t_lo, t_hi, 0, c.vocab_size)
            _check_range("positions", p_lo, p_hi, 0, c.max_positions)
            if r_hi >= cache.capacity:
                raise ValueError(f"rows must be < cache capacity {cache.capacity} (or < 0 for padding), "
                                 f"got {r_hi}")

    def decode_weights(self) -> DecodeWeights:
        """The weights arranged for `step` (built once, rebuilt if a parameter changed)."""
        stamp = tuple((p.data_ptr(), p._version) for p in self.parameters())
        cached = getattr(self, "_decode_weights", None)
        if cached is None or cached.stamp != stamp:
            cached = DecodeWeights.of(self, stamp)
            self._decode_weights = cached
        return cached

    @torch.no_grad()  # decoding only: the cache is written in place, so no autograd through it
    def step(self, tokens: Tensor, positions: Tensor, cache: KVCache, rows: Tensor, attend: Attend, *,
             workspace: Workspace | None = None, validate: bool = True, padding: bool = True,
             float_logits: bool = True) -> Tensor:
        """Logits (B, W, V) float32 for W new tokens per sample against a KV cache.

        tokens, positions, rows: (B, W) integer tensors. Token (b, w) is embedded, rotated to
        positions[b, w], and its key and value are written at cache row rows[b, w] of every layer
        (rows < 0: a padding slot, written to the scratch row, which nothing reads). Then, per layer,
        attend(layer, q (B, Hq, W, hd), cache.k(layer), cache.v(layer)) must return (B, Hq, W, hd): the
        attention of each new query over the cached rows it may see (scale 1 / sqrt(hd), query head h
        reading KV head h // group). q is a view into `workspace` (one is made when none is given).

        A step launches a fixed list of kernels, none of which waits for the host, so that a decoder
        can capture it in a CUDA graph: per layer one fused RMSNorm, ONE matmul for q, k, v and their
        RoPE partners (`DecodeWeights`), two elementwise kernels for RoPE, one scatter of k and v into
        the cache, `attend`, a copy and one matmul-plus-residual for the output projection, the MLP's
        norm, two matmuls and its gate. validate=True first checks the inputs' values (which waits
        for the GPU); a decoder checks its inputs once, outside its loop, and passes False. A decoder
        that writes its rows itself may also pass padding=False (rows hold no -1: a padding slot
        already names the scratch row) and float_logits=False (logits in the model's dtype): two
        kernels fewer each.
        """
        if validate:
            self._check_step(tokens, positions, cache, rows)
        c = self.config
        B, W = tokens.shape
        weights = self.decode_weights()
        workspace = workspace if workspace is not None else self.workspace(B, W)
        workspace.require(B, W)
        fused = self._fuses_elementwise()
        if not fused:
            cos, sin = weights.rope(positions)
        # A padding slot's key and value go to the scratch row: the same scatter for every batch.
        slots = torch.where(rows < 0, cache.scratch_row, rows) if padding else rows
        kv_rows = slots[:, None, :, None].expand(B, 2 * c.n_kv_heads, W, c.head_dim)
        # Indexing, not F.embedding: its index_select takes 7 us for 16 rows on an H200
        # (1.5 us for 1 or 48; indexing 1.5 at each), and 16 is a draft pass's usual width.
        x = self.embed.weight[tokens].view(B * W, c.d_model)
        for layer, (block, lw) in enumerate(zip(self.blocks, weights.layers, strict=True)):
            workspace.project(block.attn_norm(x), lw.qkv_rope)
            if fused:
                workspace.rotate_fused(weights.rope_table, positions)
            else:
                workspace.rotate(cos, sin)
            cache.kv(layer).scatter_(2, kv_rows, workspace.kv())
            out = attend(layer, workspace.q(), cache.k(layer), cache.v(layer))
            expected = (B, c.n_heads, W, c.head_dim)
            if not isinstance(out, Tensor) or tuple(out.shape) != expected:
                raise ValueError(f"attend must return a tensor of shape {expected}, got "
                                 f"{tuple(getattr(out, 'shape', ())) or type(out).__name__}")
            x = torch.addmm(x, out.transpose(1, 2).reshape(B * W, c.n_heads * c.head_dim).to(x.dtype),
                            lw.o_proj_t)
            gate_up = block.mlp_norm(x) @ lw.gate_up_t
            if fused:
                hidden = model_kernels.silu_mul(gate_up)
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                hidden = F.silu(gate) * up
            x = torch.addmm(x, hidden, lw.down_t)
        logits = self.final_norm(x) @ self.embed.weight.t()
        return (logits.float() if float_logits else logits).view(B, W, c.vocab_size)

    def _fuses_elementwise(self) -> bool:
        if self.fused_elementwise is not None:
            return self.fused_elementwise
        from course.core import runtime

        return self.device.type == "cuda" and not runtime.SIMULATOR

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class LayerWeights:
    qkv_rope: Tensor  # (Hq + 2 Hkv + Hq + Hkv) * hd rows: q, k, v, then q's and k's RoPE partners
    o_proj_t: Tensor  # transposed views: x @ W.t() is one matmul, no copy of W
    gate_up_t: Tensor
    down_t: Tensor


def rotate_half_rows(weight: Tensor, heads: int, head_dim: int) -> Tensor:
    """The rows of a projection whose output is rotate_half of the projection's: per head, the
    second half negated, then the first half (x1, x2) -> (-x2, x1). A signed permutation, exact."""
    w = weight.view(heads, head_dim, -1)
    half = head_dim // 2
    return torch.cat([-w[:, half:], w[:, :half]], dim=1).reshape(heads * head_dim, -1)


@dataclass(frozen=True)
class DecodeWeights:
    """A model's weights as `step` uses them, built from its parameters (same values, no training).

    RoPE rotates each pair (x1, x2) of a query or key to (x1 cos - x2 sin, x2 cos + x1 sin) =
    x cos + rotate_half(x) sin. rotate_half(W h) = (R W) h for a signed permutation R, so the rows
    R W_q and R W_k are appended to the q, k, v projection: one matmul yields q, k, v and their
    rotated partners, and RoPE is then one multiply and one multiply-add, in place (instead of a
    dozen kernels of slicing, casting and concatenating per layer). `rope_table` holds cos and sin
    of every position (RoFormer §3.4.2), so a step gathers its rows once for all layers.
    """

    layers: tuple[LayerWeights, ...]
    rope_table: Tensor  # (max_positions, 2, hd): cos and sin, each repeated over the two halves
    stamp: tuple

    @classmethod
    def of(cls, model: TinyLM, stamp: tuple) -> DecodeWeights:
        c = model.config
        layers = []
        with torch.no_grad():
            for block in model.blocks:
                q_w, kv_w = block.attn.q_proj.weight, block.attn.kv_proj.weight
                k_w = kv_w[:c.n_kv_heads * c.head_dim]
                fused = torch.cat([q_w, kv_w, rotate_half_rows(q_w, c.n_heads, c.head_dim),
                                   rotate_half_rows(k_w, c.n_kv_heads, c.head_dim)]).contiguous()
                layers.append(LayerWeights(fused, block.attn.o_proj.weight.t(), block.mlp.gate_up.weight.t(),
                                           block.mlp.down.weight.t()))
            positions = torch.arange(c.max_positions, device=model.device)[None]
            cos, sin = rope_angles(positions, c.head_dim)  # (1, 1, P, hd / 2)
            table = torch.stack([cos[0, 0], sin[0, 0]], dim=1).repeat(1, 1, 2)  # (P, 2, hd)
        return cls(tuple(layers), table.to(model.dtype).contiguous(), stamp)

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin for (B, W) positions, (B, W, 1, hd) each: one gather for the whole step."""
        B, W = positions.shape
        rows = self.rope_table[positions.reshape(-1)].view(B, W, 2, 1, -1)  # indexing: see `step`
        return rows[:, :, 0], rows[:, :, 1]


class Workspace:
    """The matmul output of one step's projections, (B * W, (2 Hq + 3 Hkv) * hd), at a fixed address.

    `step` writes every layer's q, k, v and RoPE partners here (torch.mm(..., out=)), rotates q and k
    in place, and hands `attend` a view of q. A fixed address is what lets a decoder check and set up
    its attention launch once, outside its loop, and replay the step as a CUDA graph.
    """

    def __init__(self, config: ModelConfig, batch: int, width: int, device, dtype):
        self.config, self.batch, self.width = config, batch, width
        c = config
        self.rope_heads = c.n_heads + c.n_kv_heads
        self.heads = 2 * self.rope_heads + c.n_kv_heads
        self.buffer = torch.zeros(batch * width, self.heads * c.head_dim, device=device, dtype=dtype)
        self._heads = self.buffer.view(batch, width, self.heads, c.head_dim)

    def require(self, batch: int, width: int) -> None:
        if (batch, width) != (self.batch, self.width):
            raise ValueError(f"workspace was made for (batch, width) = {(self.batch, self.width)}, the "
                             f"step has {(batch, width)}")

    def project(self, x: Tensor, weight: Tensor) -> None:
        torch.mm(x, weight.t(), out=self.buffer)

    def rotate(self, cos: Tensor, sin: Tensor) -> None:
        """RoPE on q and k in place: x cos + rotate_half(x) sin (see DecodeWeights)."""
        c = self.config
        rotated = self._heads[:, :, :self.rope_heads]
        partners = self._heads[:, :, self.rope_heads + c.n_kv_heads:]
        rotated.mul_(cos).addcmul_(partners, sin)

    def rotate_fused(self, table: Tensor, positions: Tensor) -> None:
        """`rotate` as one kernel that also reads cos and sin from the table (`model_kernels.rope`)."""
        c = self.config
        model_kernels.rope(self.buffer, table, positions.reshape(-1), self.heads, self.rope_heads,
                           self.rope_heads + c.n_kv_heads, c.head_dim)

    def q(self) -> Tensor:
        """(B, Hq, W, hd), a view."""
        return self._heads[:, :, :self.config.n_heads].transpose(1, 2)

    def kv(self) -> Tensor:
        """(B, 2 Hkv, W, hd), a view: the keys then the values, as a cache layer's channels."""
        c = self.config
        return self._heads[:, :, c.n_heads:c.n_heads + 2 * c.n_kv_heads].transpose(1, 2)
