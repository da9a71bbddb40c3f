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

Token trees (`tree_speculative_sampling`) try a node's children one after another, each
against the residual left by the rejected ones: SpecInfer's multi-step speculative sampling
(Miao et al., 2024, §4.3) for children drawn independently from the draft (with replacement),
and Sequoia's rule (Chen et al., 2024, §3.2) for children drawn without replacement, where
each sibling is tested against the draft with the earlier siblings removed. Without
replacement no two siblings repeat a token, so no part of the tree's budget is spent on a
copy of a token already rejected (which the residual then rejects for certain).

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
    "gumbel_top_k",
    "residual",
    "sample_without_replacement",
    "sibling_distributions",
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


# --------------------------------------------------------------------------- siblings, without replacement


def sample_without_replacement(q: object, k: object, uniforms: object) -> list[int]:
    """k distinct tokens drawn one after another from q, as Sequoia draws a node's children
    (Chen et al., 2024, "Sequoia", §3.2): draw i takes the inverse CDF of uniforms[i] over q with
    the earlier draws removed (renormalising is implicit: `inverse_cdf` takes unnormalised weights).
    q: a probability vector; k: at most the number of tokens with q > 0; uniforms: k numbers in [0, 1).
    The draws come in draw order (the order in which the walk tries them)."""
    weights = validate_distribution(q, "q")
    count = _draw_count(k, weights)
    if count == 0:  # a leaf: no uniforms to read
        if as_sequence(uniforms, "uniforms", "a list of k numbers in [0, 1)"):
            raise ValueError("uniforms must be empty for k = 0")
        return []
    u = [_uniform(x, f"uniforms[{i}]") for i, x in
         enumerate(real_list(uniforms, "uniforms", expected_len=count))]
    drawn: list[int] = []
    for i in range(count):
        left = [0.0 if v in drawn else w for v, w in enumerate(weights)]
        drawn.append(inverse_cdf(left, u[i]))
    return drawn


def gumbel_top_k(q: object, k: object, uniforms: object) -> list[int]:
    """The k tokens with the largest keys log q(v) + g_v, g_v = -log(-log u_v) a Gumbel noise, in
    decreasing key (ties: the smaller id first); one uniform per vocabulary entry, in [0, 1).

    This is EQUAL IN DISTRIBUTION to `sample_without_replacement` (Vieira, 2014, "Gumbel-max trick
    and weighted reservoir sampling"; Kool, van Hoof & Welling, 2019, "Stochastic Beams and Where to
    Find Them", §3): the largest key is token v with probability q(v) (the Gumbel-max trick); given
    that, the other keys are independent Gumbels conditioned to lie below it, so the next largest
    is v' with probability q(v') / (1 - q(v)), and so on: the sequential draws without
    replacement. It is NOT equal draw by draw: the two take different uniforms (k against V).
    A GPU draws a node's children this way (Sequoia's siblings, Chen et al., 2024, §3.2) with one
    topk over the vocabulary, no k-step loop.
    Tokens with q(v) = 0 (or u_v = 0) get the key -inf and are never among the k."""
    weights = validate_distribution(q, "q")
    count = _draw_count(k, weights)
    u = [_uniform(x, f"uniforms[{i}]") for i, x in
         enumerate(real_list(uniforms, "uniforms", expected_len=len(weights)))]
    keys = [math.log(w) - math.log(-math.log(x)) if w > 0.0 and x > 0.0 else -math.inf
            for w, x in zip(weights, u, strict=True)]
    return sorted(range(len(weights)), key=lambda v: (-keys[v], v))[:count]


def _draw_count(k: object, weights: list[float]) -> int:
    count = as_int(k, "k")
    support = sum(1 for w in weights if w > 0.0)
    if not 0 <= count <= support:
        raise ValueError(f"k = {count} must lie in [0, {support}]: without replacement at most the "
                         "tokens with q > 0 can be drawn")
    return count


# --------------------------------------------------------------------------- token trees


def sibling_distributions(p: object, q: object, tokens: object, *,
                          replacement: bool = False) -> list[tuple[list[float], list[float]]]:
    """[(p_1, q_1), ..., (p_{k+1}, q_{k+1})] at one node of the walk whose k children carry
    `tokens` in the order tried: sibling i is tested against (p_i, q_i), which the walk reaches
    only when siblings 1 .. i-1 were rejected; p_{k+1} is the distribution of the next token when
    every sibling is rejected.

    p_1 = p, q_1 = q. After sibling i (token x_i) is rejected (SpecInfer §4.3; Sequoia §3.2):

        p_{i+1} = max(0, p_i - q_i) / sum_v max(0, p_i(v) - q_i(v)),
        q_{i+1} = q_i                                            (replacement: SpecInfer),
        q_{i+1}(v) = q(v) / S_{i+1} for v not drawn, 0 for drawn (without: Sequoia),
        S_{i+1} = sum of q(v) over the tokens v not drawn: the draft mass left.

(q_1 = q as given, S_1 = 1: q is a distribution. S_{i+1} is summed over what is left rather
than taken as 1 - q(x_1) - ... - q(x_i): q sums to 1 only within rounding, and S can be tiny.)

    Two cases no draft that draws from q produces, each given a rule that needs no new state:
    * an empty residual (p_i <= q_i everywhere: for distributions only p_i = q_i, where only a
      token with p_i = q_i = 0 is rejected): the state is kept, p_{i+1} = p_i, q_{i+1} = q_i
      (x_i counts as not drawn), as SpecInfer's rule keeps p;
    * no draft mass left (S_i = 0: every token with q > 0 drawn): q_i is all zeros, the
      sibling cannot have been drawn and is rejected (`sibling_accepts`), and the state is kept.
    """
    p_i = validate_distribution(p, "p")
    q_all = validate_distribution(q, "q", len(p_i))
    ids = [_token(x, f"tokens[{i}]", len(p_i)) for i, x in
           enumerate(as_sequence(tokens, "tokens", "a list of token ids"))]
    if not replacement:
        _require_distinct(ids, list(range(len(ids))))
    q_i, drawn = list(q_all), set()
    steps = [(p_i, q_i)]
    for x in ids:
        residual_i = [max(0.0, a - b) for a, b in zip(p_i, q_i, strict=True)]
        if any(q_i) and any(residual_i):
            total = math.fsum(residual_i)
            p_i = [w / total for w in residual_i]
            if not replacement:
                drawn.add(x)
                left = [0.0 if v in drawn else w for v, w in enumerate(q_all)]
                mass = math.fsum(left)
                q_i = [w / mass for w in left] if mass > 0.0 else left
        steps.append((p_i, q_i))
    return steps


def sibling_accepts(r: float, p_i: list[float], q_i: list[float], x: int) -> bool:
    """The test of a sibling with token x against (p_i, q_i): r q_i(x) < p_i(x) (`accepts`), and
    never when q_i is all zeros (no draft mass was left to draw x from)."""
    return any(q_i) and accepts(r, p_i[x], q_i[x])


def _require_distinct(ids: list[int], labels: list[int], where: str = "") -> None:
    """Siblings drawn without replacement carry distinct tokens; ids[j] is tokens[labels[j]]."""
    seen: dict[int, int] = {}
    for label, x in zip(labels, ids, strict=True):
        if x in seen:
            raise ValueError(f"tokens[{seen[x]}] = tokens[{label}] = {x}: siblings{where} drawn without "
                             "replacement cannot repeat a token (pass replacement=True for independent "
                             "draws)")
        seen[x] = label


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
                              accept_uniforms: object, sample_uniforms: object, *,
                              replacement: bool = False) -> tuple[list[int], int]:
    """Multi-step speculative sampling over a token tree: (accepted path of node ids from the
    root, next token). replacement=False (the default): a node's children were drawn from its
    draft distribution q[node] WITHOUT replacement (Sequoia, Chen et al., 2024, §3.2; e.g. by
    `sample_without_replacement` or `gumbel_top_k`), so siblings carry distinct tokens.
    replacement=True: each child drawn independently from q[node] (SpecInfer, Miao et al., 2024,
    §4.3, Algorithm 2), so siblings may repeat.

    parents: the token tree, node 0 the root (the last verified token), parents before children;
    tokens[i]: node i's token id; q[i], p[i]: draft and target distributions at node i (of the
    token that follows node i); accept_uniforms[i]: the test of node i (i >= 1) against its
    parent's distributions (entry 0 is unused); sample_uniforms[i]: the draw at node i if the
    walk stops there.

    At node u the children are tried in increasing id (the draw order): child i, token x_i, is
    accepted if r q_i(x_i) < p_i(x_i), with (p_i, q_i) from `sibling_distributions` (q_i: q_u
    with the earlier siblings removed and renormalised; p_i: the residual after the earlier
    rejections); when every child is rejected (or u is a leaf) the next token is drawn from
    p_{k+1} by the inverse CDF. A chain gives exactly `speculative_sampling` in both modes.

    Why the emitted token follows p_u (induction over the siblings, the same in both modes):
    write D_i for the distribution of what the walk emits at u when it starts trying at sibling
    i. The last step is the draw, D_{k+1} = p_{k+1}. Sibling i's token x_i ~ q_i is accepted with
    probability min(1, p_i/q_i): it emits x_i with probability min(q_i, p_i)(x_i) and otherwise,
    with probability 1 - sum min(q_i, p_i) = sum max(0, p_i - q_i), goes on with p_{i+1} =
    max(0, p_i - q_i)/sum(...). p_{i+1} does not depend on which x_i was drawn (it is a function
    of p_i and q_i alone), so if D_{i+1} = p_{i+1}, then D_i = min(q_i, p_i) + max(0, p_i - q_i)
    = p_i. Hence D_1 = p_1 = p_u. Without replacement, q_{i+1} depends on x_i; but given that
    x_i was rejected, x_{i+1} is drawn from q_{i+1} and tested against it, and the induction
    hypothesis holds for every value of x_i (and a rejected x_i has p_{i+1}(x_i) = 0, see
    `sibling_distributions`). An accepted child then continues the walk with its own p and q.
    """
    p_rows = as_sequence(p, "p", "a list of probability vectors, one per node")
    n = len(p_rows)
    target = _distributions(p_rows, "p", n, None)
    vocabulary = len(target[0])
    draft = _distributions(q, "q", n, vocabulary)
    par, children, ids = _tree(parents, tokens, vocabulary)
    if len(par) != n:
        raise ValueError(f"parents has {len(par)} nodes, p has {n} rows")
    if not replacement:
        for node, kids in enumerate(children):
            _require_distinct([ids[c] for c in kids], kids, f" (children of node {node})")
    r = real_list(accept_uniforms, "accept_uniforms", expected_len=n)
    u = real_list(sample_uniforms, "sample_uniforms", expected_len=n)
    r = [r[0]] + [_uniform(x, f"accept_uniforms[{i}]") for i, x in enumerate(r) if i > 0]
    u = [_uniform(x, f"sample_uniforms[{i}]") for i, x in enumerate(u)]
    path, node = [0], 0
    while True:
        kids = children[node]
        steps = sibling_distributions(target[node], draft[node], [ids[c] for c in kids],
                                      replacement=replacement)
        child = next((c for c, (p_i, q_i) in zip(kids, steps, strict=False)
                      if sibling_accepts(r[c], p_i, q_i, ids[c])), None)
        if child is None:
            return path, inverse_cdf(steps[-1][0], u[node])
        path.append(child)
        node = child


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
