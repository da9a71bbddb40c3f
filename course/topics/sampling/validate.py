"""Argument checks of notebook 15's speculative sampling launchers; every message names the argument.

`solutions/spec_sampling.py` calls `sampling_inputs` before it launches a kernel: token ids in the
vocabulary, probabilities that sum to 1, uniforms in [0, 1) and a vocabulary that fits the tiles.
"""

from __future__ import annotations

import math

import torch
import triton

from course.core.validate import require_tensor
from pyspec_ref.sampling import NORMALISATION_TOLERANCE  # |sum(p) - 1| allowed

MAX_TILES = 4096  # the resample kernel holds a row's T partial sums in one block
TOKEN_DTYPES = (torch.int32, torch.int64)


def _where(index: torch.Tensor) -> str:
    return ", ".join(str(int(i)) for i in index)


def _require_uniforms(u: torch.Tensor, name: str, shape: tuple[int, ...]) -> None:
    require_tensor(u, name, ndim=2, dtypes=(torch.float32,))
    if tuple(u.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(u.shape)}")
    bad = torch.nonzero((u < 0) | (u >= 1))
    if len(bad):
        where = bad[0]
        raise ValueError(f"{name}[{_where(where)}] = {float(u[tuple(where)])} must lie in [0, 1)")


def _require_probabilities(t: torch.Tensor, name: str) -> None:
    negative = torch.nonzero(t < 0)
    if len(negative):
        where = negative[0]
        raise ValueError(f"{name}[{_where(where)}] = {float(t[tuple(where)])} is negative: "
                         "probabilities must be >= 0 (logits? pass from_logits=True)")
    totals = t.sum(dim=-1, dtype=torch.float64)
    off = torch.nonzero((totals - 1).abs() > NORMALISATION_TOLERANCE)
    if len(off):
        where = off[0]
        raise ValueError(f"{name}[{_where(where)}] sums to {float(totals[tuple(where)]):.6g}, not 1 (within "
                         f"{NORMALISATION_TOLERANCE}): pass probabilities, or logits with from_logits=True")


def logits_pair(q_logits, p_logits) -> None:
    """The sigmoid form's (B, gamma + 1, V) float32 logits, named as its caller names them."""
    for name, tensor in (("q_logits", q_logits), ("p_logits", p_logits)):
        require_tensor(tensor, name, ndim=3, dtypes=(torch.float32,))


def sampling_inputs(draft_tokens, q, p, accept_uniforms, sample_uniforms, form: str, tile: int, alpha=1.0,
                    beta=0.0) -> tuple[int, int, int, int]:
    """Check every argument of `prepare_sampling`, each error naming it; return (B, gamma, V, tile).

    tile: the vocabulary entries per program (spec_sampling.TILE unless the caller chose one).
    """
    require_tensor(draft_tokens, "draft_tokens", ndim=2, dtypes=TOKEN_DTYPES)
    batch, gamma = draft_tokens.shape
    require_tensor(q, "q", ndim=3, dtypes=(torch.float32,))
    require_tensor(p, "p", ndim=3, dtypes=(torch.float32,))
    vocabulary = q.shape[2]
    if tuple(q.shape) != (batch, gamma, vocabulary):
        raise ValueError(f"q must have shape (B, gamma, V) = ({batch}, {gamma}, V) to match draft_tokens "
                         f"{tuple(draft_tokens.shape)}, got {tuple(q.shape)}")
    if tuple(p.shape) != (batch, gamma + 1, vocabulary):
        raise ValueError(f"p must have shape (B, gamma + 1, V) = {(batch, gamma + 1, vocabulary)} to match "
                         f"draft_tokens {tuple(draft_tokens.shape)} and q {tuple(q.shape)}, "
                         f"got {tuple(p.shape)}")
    _require_uniforms(accept_uniforms, "accept_uniforms", (batch, gamma))
    if sample_uniforms is not None:
        _require_uniforms(sample_uniforms, "sample_uniforms", (batch, gamma + 1))
    for name, tensor in (("q", q), ("p", p), ("accept_uniforms", accept_uniforms)):
        if tensor.device != draft_tokens.device:
            raise ValueError(f"{name} must be on draft_tokens' device {draft_tokens.device}, "
                             f"got {tensor.device}")
    bad = torch.nonzero((draft_tokens < 0) | (draft_tokens >= vocabulary))
    if len(bad):
        where = bad[0]
        raise ValueError(f"draft_tokens[{_where(where)}] = {int(draft_tokens[tuple(where)])} is not a "
                         f"token id in [0, {vocabulary})")
    if form == "probs":
        _require_probabilities(q, "q")
        _require_probabilities(p, "p")
    for name, value in (("alpha", alpha), ("beta", beta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 16 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two >= 16, got {tile!r}")
    if triton.cdiv(vocabulary, tile) > MAX_TILES:
        raise ValueError(f"V = {vocabulary} needs {triton.cdiv(vocabulary, tile)} tiles of {tile}; at most "
                         f"{MAX_TILES} are supported: pass a larger tile")
    return batch, gamma, vocabulary, tile


def sibling_draw_args(logits, uniforms, k, max_vocab: int) -> tuple[int, int]:
    """The arguments of `tree_shape.draw_siblings`, each error naming the bad one; returns (nodes, V)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a (nodes, V) float tensor, got "
                         f"{getattr(logits, 'shape', type(logits).__name__)}")
    nodes, vocab = logits.shape
    if not 1 <= vocab <= max_vocab or nodes < 1:
        raise ValueError(f"logits has shape {tuple(logits.shape)}: nodes >= 1 and 1 <= V <= {max_vocab}")
    if not torch.isfinite(logits).all():
        raise ValueError("logits holds NaN or infinity: every token needs a finite score")
    if not isinstance(uniforms, torch.Tensor) or uniforms.dtype != torch.float64 \
            or tuple(uniforms.shape) != (nodes, vocab):
        raise ValueError(f"uniforms must be a ({nodes}, {vocab}) float64 tensor (one per token), got "
                         f"{getattr(uniforms, 'dtype', type(uniforms).__name__)} "
                         f"{tuple(getattr(uniforms, 'shape', ()))}")
    if uniforms.device != logits.device:
        raise ValueError(f"uniforms is on {uniforms.device}, logits on {logits.device}: put them together")
    if torch.isnan(uniforms).any() or (uniforms < 0).any() or (uniforms >= 1).any():
        raise ValueError("uniforms must lie in [0, 1)")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= vocab:
        raise ValueError(f"k must be an int in [1, V = {vocab}] (siblings are distinct tokens), got {k!r}")
    return nodes, vocab
