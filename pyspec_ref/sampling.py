"""Speculative sampling and token-tree verification, written the way the papers state them.

Speculative sampling (Leviathan et al., 2023, "Fast Inference from Transformers via
Speculative Decoding", Algorithm 1; Chen et al., 2023, "Accelerating Large Language Model
Decoding with Speculative Sampling", Algorithm 2; the seed paper "Optimized Speculative
Sampling for GPU Hardware Accelerators", Eq. 1-4): a draft model proposes tokens
x_1 .. x_gamma with distributions q_1 .. q_gamma; the target model scores all of them at
once, giving p_1 .. p_{gamma+1}. Draft token x_c is accepted while r_c < min(1,
p_c(x_c) / q_c(x_c)); at the first rejection the emitted token is drawn from the residual
max_norm(p_c - q_c) = max(0, p_c - q_c) / sum(max(0, p_c - q_c)); if every draft token
is accepted, a bonus token is drawn from p_{gamma+1}. The emitted tokens then follow the
target distribution exactly, whatever the draft.

Random numbers are inputs, so that this specification and every kernel emit the same
tokens from the same inputs:

* ``accept_uniforms[c]`` in [0, 1): the acceptance test of draft position c;
* ``sample_uniforms[c]`` in [0, 1): the draw at position c (a resample after a rejection
  at c, or the bonus token at c = gamma), by the inverse CDF: the smallest token i with
  w_0 + ... + w_i > u * (w_0 + ... + w_{V-1}) for the weights w of the distribution.

Why the inverse CDF (and not exponential noise for an argmax race): it needs one number
per position instead of V, and a kernel that already sums each vocabulary tile (the seed
paper's partial sums b_k) finds the crossing tile from those sums and scans one tile.

Exactness: the acceptance test is written r * q(x) < p(x), which is r < min(1, p/q)
for r in [0, 1) and q > 0, needs no division, and accepts when q(x) = 0 < p(x) (a token the
draft gives no mass cannot be over-proposed). The comparison is strict because r lies in
[0, 1): for r uniform on a grid of step 2^-k (a float32 torch.rand has k = 24), P(r < tau)
is exactly tau for every tau on the grid, tau = 0 included, while P(r <= tau) is tau + 2^-k
there. So r <= tau lets r = 0 accept a token with p(x) = 0, which the target forbids, once
in 2^24 draws; top-k and top-p sampling rely on such tokens never being emitted. The papers
write r <= tau (the seed paper's Eq. 1) for a continuous r ~ U(0, 1), where r = tau has
probability 0 and the two tests agree. For float32 inputs every product and difference here
is exact in double precision, and the CDF is summed exactly (as fractions), so a kernel can
differ from this specification only where its own float32 rounding crosses a threshold --
which a check can detect and count.

Single samples take lists; the batch is a loop over samples (see `speculative_sampling_batch`).
"""

from __future__ import annotations

import math
from fractions import Fraction

from ._validate import as_int, as_real, as_sequence, real_list
from .trees import validate_parents, validate_topological

__all__ = [
    "accepts",
    "greedy_tree_verification",
    "inverse_cdf",
    "residual",
    "speculative_sampling",
    "speculative_sampling_batch",
    "tree_speculative_sampling",
    "validate_distribution",
]

NORMALISATION_TOLERANCE = 1e-3  # |sum(p) - 1| allowed: float32 softmax over 150k tokens is far closer
PAD = -1  # the emitted-token rows are padded with -1 after the last emitted token


# --------------------------------------------------------------------------- validation


def validate_distribution(p: object, name: str, size: int | None = None) -> list[float]:
    """A probability vector, as Leviathan et al.'s Algorithm 1 takes p and q: finite, non-negative
    entries summing to 1 within NORMALISATION_TOLERANCE (NaN, negative or unnormalised vectors are
    refused)."""
    values = real_list(p, name, expected_len=size)
    for i, x in enumerate(values):
        if x < 0.0:
            raise ValueError(f"{name}[{i}] = {x} is negative: probabilities must be >= 0")
    total = math.fsum(values)
    if abs(total - 1.0) > NORMALISATION_TOLERANCE:
        raise ValueError(f"{name} sums to {total}, not 1 (within {NORMALISATION_TOLERANCE}): "
                         "pass probabilities, not logits or unnormalised weights")
    return values


def _uniform(u: object, name: str) -> float:
    x = as_real(u, name)
    if not 0.0 <= x < 1.0:
        raise ValueError(f"{name} = {x} must lie in [0, 1)")
    return x


def _token(x: object, name: str, vocabulary: int | None) -> int:
    """A token id: an int in [0, vocabulary), or >= 0 when the vocabulary is not known."""
    token = as_int(x, name)
    if token < 0 or (vocabulary is not None and token >= vocabulary):
        limit = f"[0, {vocabulary})" if vocabulary is not None else ">= 0"
        raise ValueError(f"{name} = {token} is not a token id {limit}")
    return token


def _distributions(rows: object, name: str, count: int, vocabulary: int | None) -> list[list[float]]:
    items = as_sequence(rows, name, "a list of probability vectors")
    if len(items) != count:
        raise ValueError(f"{name} has {len(items)} rows, expected {count}")
    out = []
    for c, row in enumerate(items):
        out.append(validate_distribution(row, f"{name}[{c}]", vocabulary))
        vocabulary = len(out[0])
    return out


# --------------------------------------------------------------------------- the pieces


def accepts(r: float, p_x: float, q_x: float) -> bool:
    """r < min(1, p(x) / q(x)), written r * q(x) < p(x) (Leviathan et al., Algorithm 1). Strict:
    for r uniform in [0, 1) it accepts with probability exactly min(1, p/q), and never a token
    with p(x) = 0, even for r = 0 (see the module docstring)."""
    return r * q_x < p_x


def residual(p: list[float], q: list[float]) -> list[float]:
    """max(0, p - q), the unnormalised residual distribution (Leviathan et al., §2.3; the seed
    paper's f = p - q and a = max(0, f)). p and q: probability vectors of one length."""
    p = validate_distribution(p, "p")
    q = validate_distribution(q, "q", len(p))
    return [max(0.0, a - b) for a, b in zip(p, q, strict=True)]


def inverse_cdf(weights: list[float], u: float) -> int:
    """The smallest i with w_0 + ... + w_i > u * sum(w), summed exactly: a draw from the
    distribution w / sum(w) by the uniform u (every draw of Leviathan et al.'s Algorithm 1:
    the resample and the bonus token). Zero-weight tokens are never drawn. weights: finite,
    non-negative, with a positive sum (unnormalised is fine); u in [0, 1)."""
    values = real_list(weights, "weights")
    for i, w in enumerate(values):
        if w < 0.0:
            raise ValueError(f"weights[{i}] = {w} is negative: weights must be >= 0")
    u = _uniform(u, "u")
    exact = [Fraction(w) for w in values]
    threshold = Fraction(u) * sum(exact)
    if not any(exact):
        raise ValueError("weights must have a positive sum, got all zeros")
    cumulative = Fraction(0)
    for i, w in enumerate(exact):
        cumulative += w
        if cumulative > threshold:
            return i
    raise AssertionError("unreachable: u < 1 keeps the threshold below the total")


# --------------------------------------------------------------------------- chains


def speculative_sampling(draft_tokens: object, q: object, p: object, accept_uniforms: object,
                         sample_uniforms: object) -> tuple[int, list[int]]:
    """(accepted, emitted) for one sample: Leviathan et al., Algorithm 1 (Chen et al., Algorithm 2).

    draft_tokens: gamma ids; q: gamma draft distributions; p: gamma + 1 target distributions
    (row c scores position c; row gamma is the bonus position); accept_uniforms: gamma numbers;
    sample_uniforms: gamma + 1 numbers. emitted has gamma + 1 entries: the accepted draft tokens,
    then the resampled (or bonus) token, then PAD.
    """
    tokens = as_sequence(draft_tokens, "draft_tokens", "a list of token ids")
    gamma = len(tokens)
    if gamma < 1:
        raise ValueError("draft_tokens must hold at least one token (gamma >= 1)")
    target = _distributions(p, "p", gamma + 1, None)
    vocabulary = len(target[0])
    draft = _distributions(q, "q", gamma, vocabulary)
    tokens = [_token(x, f"draft_tokens[{c}]", vocabulary) for c, x in enumerate(tokens)]
    r = [_uniform(x, f"accept_uniforms[{c}]") for c, x in
         enumerate(real_list(accept_uniforms, "accept_uniforms", expected_len=gamma))]
    u = [_uniform(x, f"sample_uniforms[{c}]") for c, x in
         enumerate(real_list(sample_uniforms, "sample_uniforms", expected_len=gamma + 1))]
    emitted = []
    for c, x in enumerate(tokens):
        if not accepts(r[c], target[c][x], draft[c][x]):
            weights = residual(target[c], draft[c])
            # p == q exactly leaves no residual; then p itself is the right distribution.
            emitted.append(inverse_cdf(weights if any(weights) else target[c], u[c]))
            return c, emitted + [PAD] * (gamma - c)
        emitted.append(x)
    emitted.append(inverse_cdf(target[gamma], u[gamma]))  # all accepted: the bonus token
    return gamma, emitted


def speculative_sampling_batch(draft_tokens: object, q: object, p: object, accept_uniforms: object,
                               sample_uniforms: object) -> tuple[list[int], list[list[int]]]:
    """([accepted per sample], [emitted per sample]): Leviathan et al.'s Algorithm 1 (the
    seed paper's Eq. 1-4), `speculative_sampling` on each sample b of
    (B x gamma) tokens, (B x gamma x V) q, (B x (gamma+1) x V) p and the matching uniforms."""
    rows = [as_sequence(x, name, "a list with one entry per sample")
            for x, name in ((draft_tokens, "draft_tokens"), (q, "q"), (p, "p"),
                            (accept_uniforms, "accept_uniforms"), (sample_uniforms, "sample_uniforms"))]
    batch = len(rows[0])
    for row, name in zip(rows[1:], ("q", "p", "accept_uniforms", "sample_uniforms"), strict=True):
        if len(row) != batch:
            raise ValueError(f"{name} has {len(row)} samples, draft_tokens has {batch}")
    results = [speculative_sampling(*(row[b] for row in rows)) for b in range(batch)]
    return [a for a, _ in results], [e for _, e in results]


# --------------------------------------------------------------------------- token trees


def _tree(parents: object, tokens: object,
          vocabulary: int | None) -> tuple[list[int], list[list[int]], list[int]]:
    par = validate_topological(validate_parents(parents))
    if par[0] != -1:
        raise ValueError("parents[0] must be -1: node 0 is the root (the last verified token)")
    ids = as_sequence(tokens, "tokens", "a list of token ids, one per node")
    if len(ids) != len(par):
        raise ValueError(f"tokens has {len(ids)} entries, parents has {len(par)} nodes")
    # The root's token is already verified: only its id's range is checked.
    ids = [_token(x, f"tokens[{i}]", vocabulary) for i, x in enumerate(ids)]
    children: list[list[int]] = [[] for _ in par]
    for node, parent in enumerate(par[1:], start=1):
        children[parent].append(node)
    return par, children, ids


def tree_speculative_sampling(parents: object, tokens: object, q: object, p: object,
                              accept_uniforms: object, sample_uniforms: object) -> tuple[list[int], int]:
    """SpecInfer's multi-step speculative sampling over a token tree (Miao et al., 2024,
    "SpecInfer", §4.3, Algorithm 2), with every child of a node drawn from that node's draft
    distribution q[node]: (accepted path of node ids from the root, next token).

    parents: the token tree, node 0 the root (the last verified token), parents before children;
    tokens[i]: node i's token id; q[i], p[i]: draft and target distributions at node i (of the
    token that follows node i); accept_uniforms[i]: the test of node i (i >= 1) against its
    parent's distributions (entry 0 is unused); sample_uniforms[i]: the draw at node i if the
    walk stops there. At node u the children are tried in increasing id: child s is accepted if
    r_s * q_u(x_s) < p_u(x_s); on rejection p_u <- max_norm(p_u - q_u) and s is dropped; when
    every child is rejected (or u is a leaf) the next token is drawn from the current p_u.
    A chain gives exactly `speculative_sampling`.
    """
    p_rows = as_sequence(p, "p", "a list of probability vectors, one per node")
    n = len(p_rows)
    target = _distributions(p_rows, "p", n, None)
    vocabulary = len(target[0])
    draft = _distributions(q, "q", n, vocabulary)
    par, children, ids = _tree(parents, tokens, vocabulary)
    if len(par) != n:
        raise ValueError(f"parents has {len(par)} nodes, p has {n} rows")
    r = real_list(accept_uniforms, "accept_uniforms", expected_len=n)
    u = real_list(sample_uniforms, "sample_uniforms", expected_len=n)
    r = [r[0]] + [_uniform(x, f"accept_uniforms[{i}]") for i, x in enumerate(r) if i > 0]
    u = [_uniform(x, f"sample_uniforms[{i}]") for i, x in enumerate(u)]
    path, node = [0], 0
    while True:
        p_node = target[node]
        for child in children[node]:
            x = ids[child]
            if accepts(r[child], p_node[x], draft[node][x]):
                path.append(child)
                node = child
                break
            weights = residual(p_node, draft[node])
            if any(weights):  # p == q leaves nothing to renormalise: keep p
                total = math.fsum(weights)
                p_node = [w / total for w in weights]
        else:
            return path, inverse_cdf(p_node, u[node])


def greedy_tree_verification(parents: object, tokens: object, target_argmax: object) -> tuple[list[int], int]:
    """Greedy verification (SpecInfer §4.3, greedy decoding): the longest root path whose every
    token equals the target's argmax at its parent; returns (path of node ids, next token =
    the target's argmax at the path's last node). Children are tried in increasing id."""
    par, children, ids = _tree(parents, tokens, None)
    best = as_sequence(target_argmax, "target_argmax", "a list of token ids, one per node")
    if len(best) != len(par):
        raise ValueError(f"target_argmax has {len(best)} entries, parents has {len(par)} nodes")
    best = [_token(x, f"target_argmax[{i}]", None) for i, x in enumerate(best)]
    path, node = [0], 0
    while True:
        match = next((child for child in children[node] if ids[child] == best[node]), None)
        if match is None:
            return path, best[node]
        path.append(match)
        node = match
