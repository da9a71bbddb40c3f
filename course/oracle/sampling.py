"""Torch oracles of `pyspec_ref.sampling`, for vocabularies too large for pure Python: speculative
sampling of a chain (notebook 15) and of a token tree (notebook 16). tests/test_oracle.py checks
each against the specification."""

from __future__ import annotations

import torch

FORMS = ("probs", "logits", "sigmoid")


def weights_of(t: torch.Tensor, form: str, alpha: float = 1.0, beta: float = 0.0) -> torch.Tensor:
    """The distributions' weights: probabilities as given, softmax(logits), or sigmoid(alpha z + beta)."""
    if form == "probs":
        return t
    if form == "logits":
        return torch.softmax(t, dim=-1)
    if form == "sigmoid":
        return torch.sigmoid(alpha * t + beta)
    raise ValueError(f"form must be one of {FORMS}, got {form!r}")


def speculative_sampling(draft_tokens, q, p, accept_uniforms, sample_uniforms, *, form: str = "probs",
                         alpha: float = 1.0, beta: float = 0.0, dtype: torch.dtype = torch.float32):
    """(accepted (B,) int32, emitted (B, gamma + 1)) computed with PyTorch operations, step by step,
    the way Hugging Face Transformers' `_speculative_sampling` does it, batched:

    softmax of both tensors (written out whole), gather of q(x) and p(x), the test, the cumulative
    test (the first rejection), the residual max(0, p - q) of the row that needs it (p at the bonus
    position, or where the residual is empty), and the draw. Two differences, so that it computes
    `pyspec_ref.sampling.speculative_sampling_batch`: the test is r * q(x) < p(x) (Transformers
    divides, p(x) / q(x) >= r), and the draw is the inverse CDF of the given uniform (cumsum and
    searchsorted) where Transformers calls torch.multinomial. No step waits for the host.

    dtype float32 is the baseline that the kernels are timed against; float64 is the reference
    that the kernels' outputs are compared with at sizes too large for pyspec_ref.
    """
    batch, gamma = draft_tokens.shape
    q_w = weights_of(q.to(dtype), form, alpha, beta)
    p_w = weights_of(p.to(dtype), form, alpha, beta)
    x = draft_tokens.long().unsqueeze(-1)
    q_x = q_w.gather(-1, x).squeeze(-1)
    p_x = p_w[:, :gamma].gather(-1, x).squeeze(-1)
    accept = accept_uniforms.double() * q_x.double() < p_x.double()  # exact for float32 inputs
    accepted = accept.int().cumprod(dim=1).sum(dim=1)  # draft tokens before the first rejection
    rows = torch.arange(batch, device=q.device)
    p_row = p_w[rows, accepted]
    q_row = q_w[rows, accepted.clamp(max=gamma - 1)] * (accepted < gamma).unsqueeze(-1).to(dtype)
    residual = (p_row - q_row).clamp(min=0)
    empty = ~(residual > 0).any(dim=-1)  # p == q (or p <= q everywhere): sample from p
    w = torch.where(empty.unsqueeze(-1), p_row, residual)
    cdf = w.cumsum(dim=-1)
    threshold = sample_uniforms[rows, accepted].to(dtype) * cdf[:, -1]
    token = torch.searchsorted(cdf, threshold.unsqueeze(-1), right=True).squeeze(-1)  # first cdf > u*total
    token = token.clamp(max=q.shape[-1] - 1)  # u * total rounded up to the total
    columns = torch.arange(gamma + 1, device=q.device)
    padded = torch.cat([draft_tokens.long(), torch.full((batch, 1), -1, device=q.device)], dim=1)
    emitted = torch.where(columns < accepted.unsqueeze(-1), padded,
                          torch.where(columns == accepted.unsqueeze(-1), token.unsqueeze(-1), -1))
    return accepted.to(torch.int32), emitted.to(draft_tokens.dtype)


def tree_speculative_sampling(parents: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                              accept: torch.Tensor, sample: torch.Tensor, *, replacement: bool = False
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The specification's walk with float64 torch vectors on the inputs' device, for vocabularies
    too large for pure Python (the benchmarks): (path (B, N) int32 padded with -1, next token (B,)).
    Siblings drawn without replacement (Sequoia; the default) or with (SpecInfer), as in
    `pyspec_ref.sampling.tree_speculative_sampling`. It normalises the residual and the draft
    left at each rejection as the specification does (`sibling_distributions`), and draws with a
    float64 cumsum: it agrees with pyspec_ref up to float64 rounding, like the kernels."""
    batch, n = tokens.shape
    path = torch.full((batch, n), -1, dtype=torch.int32)
    next_token = torch.empty(batch, dtype=torch.int32)
    rows_parents, rows_tokens = parents.tolist(), tokens.tolist()
    rows_accept = accept.double().tolist()
    rows_sample = sample.double().tolist()
    for b in range(batch):
        children = [[] for _ in range(n)]
        for child in range(1, n):
            children[rows_parents[b][child]].append(child)
        nodes, node = [0], 0
        while True:
            p_node, q_all = p[b, node].double(), q[b, node].double()
            q_node, left = q_all, torch.ones_like(q_all, dtype=torch.bool)  # left: tokens not drawn
            moved = False
            for child in children[node]:
                x = rows_tokens[b][child]
                if bool(q_node.any()) and rows_accept[b][child] * float(q_node[x]) < float(p_node[x]):
                    nodes.append(child)
                    node, moved = child, True
                    break
                weights = (p_node - q_node).clamp(min=0.0)
                total = float(weights.sum())
                if total > 0.0 and bool(q_node.any()):
                    p_node = weights / total
                    if not replacement:
                        left[x] = False
                        mass = float(q_all[left].sum())
                        q_node = (torch.where(left, q_all / mass, 0.0) if mass > 0.0
                                  else torch.zeros_like(q_all))
            if not moved:
                cumulative = torch.cumsum(p_node, dim=0)
                threshold = rows_sample[b][node] * float(cumulative[-1])
                token = int(torch.searchsorted(cumulative, torch.tensor([threshold], dtype=torch.float64,
                                                                        device=cumulative.device),
                                               right=True))
                next_token[b] = min(token, p_node.shape[0] - 1)
                path[b, : len(nodes)] = torch.tensor(nodes, dtype=torch.int32)
                break
    return path, next_token
