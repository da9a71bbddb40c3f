"""Checks for notebook 16: token-tree verification, sampled (Sequoia, SpecInfer) and greedy.

A module exposes `tree_speculative_sampling(tree, tokens, q, p, accept_uniforms,
sample_uniforms, *, replacement=False) -> (path, next_token)` and
`greedy_tree_verification(tree, tokens, target)` (see solutions/tree_verification.py). Every
tree of a batch is compared with `pyspec_ref.sampling` on the same random numbers; where a
batch differs, `diagnose` replays the closed-form walk with one known mistake at a time and
names the mistake that reproduces the kernel's results.

Exactness. The kernels take float32 probabilities and compute in float64; the specification
sums the vocabulary exactly. The first test at a node, r * q(x) < p(x), is a product of two
float32 numbers (exact in float64) against a float32 number, so it must agree bit for bit.
Tests after a rejection and the final draw use sums over the vocabulary, so a tree may come
out differently where such a comparison lies within float64 rounding of its threshold:
`reference_walk` replays the specification's walk and lists those decisions, and
`compare_sampling` counts a differing tree as "within rounding" only when its walk has one
(and fails when they pass ROUNDING_SHARE of the trees, or on any other difference).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from fractions import Fraction

import torch

from course.checks import CaseResult, rerun_problem
from course.core import inputs, runtime
from course.measure.stats import (
    chi_square_p_value,  # also read by notebook 16 as tv_checks.chi_square_p_value
)
from pyspec_ref import sampling as spec

ROUNDING_SHARE = 0.05  # at most this share of trees (or one) may differ within rounding
UNIT_ROUNDOFF = 2.0 ** -53  # float64
SIGNIFICANCE = 1e-4  # the chi-square tests fail by chance once in 10^4 runs


# --------------------------------------------------------------------------- inputs


def draft_and_target(batch: int, n: int, vocabulary: int, seed: int, device=None,
                     mismatch: float = 1.0, sharpness: float = 2.0,
                     temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, p), float32 (B, N, V): the target's logits are sharpness * z, the draft's the same plus
    mismatch * z' (z, z' standard normal): mismatch 0 gives q = p, larger values a worse draft.
    Both are sampled at `temperature` (softmax of logits / temperature)."""
    shape = (batch, n, vocabulary)
    target = inputs.random_tensor(shape, seed, torch.float64, device) * sharpness
    draft = target + mismatch * inputs.random_tensor(shape, seed + 1, torch.float64, device)
    return (torch.softmax(draft / temperature, dim=-1).to(torch.float32),
            torch.softmax(target / temperature, dim=-1).to(torch.float32))


def draft_tokens(parents: torch.Tensor, q: torch.Tensor, seed: int,
                 replacement: bool = False) -> torch.Tensor:
    """(B, N) int32 tokens as a draft model proposes them: node i's token drawn from q at its
    parent, the root's uniformly. Both ways take the largest keys log q + Gumbel noise (exact for
    any q, where torch.multinomial on float32 is not, for tiny probabilities): without replacement
    (Sequoia §3.2) the children of one node share one set of keys and take its top k
    (`pyspec_ref.sampling.gumbel_top_k`), the child with the i-th smallest id the i-th largest key
    (the draw order); with replacement every child has keys of its own and takes their argmax."""
    batch, n, vocabulary = q.shape
    generator = torch.Generator(device=q.device).manual_seed(seed)
    tokens = torch.randint(0, vocabulary, (batch, n), generator=generator, device=q.device)
    if n == 1:
        return tokens.to(torch.int32)
    # The node each child continues, and how many of its siblings were drawn before it (its rank).
    parent_rows, rank_rows = [], []
    for tree in parents.tolist():
        earlier = [0] * n
        rank_rows.append([])
        for child in range(1, n):
            rank_rows[-1].append(earlier[tree[child]])
            earlier[tree[child]] += 1
        parent_rows.append(tree[1:])
    parents_of = torch.tensor(parent_rows, device=q.device)
    ranks_of = torch.tensor(rank_rows, device=q.device)

    def gumbel_keys(log_q):
        u = torch.rand(log_q.shape, generator=generator, dtype=torch.float64, device=q.device)
        return log_q - (-u.clamp(min=1e-300).log()).log()

    for b in range(batch):  # one tree at a time: float64 keys of a whole batch would not fit a GPU
        log_q = q[b].double().log()  # q = 0: -inf, never before a token with q > 0
        if replacement:  # every child its own keys
            tokens[b, 1:] = gumbel_keys(log_q[parents_of[b]]).argmax(dim=-1)
        else:  # one set of keys per node, its children the top k in draw order
            top = gumbel_keys(log_q).topk(int(ranks_of[b].max()) + 1, dim=-1).indices
            tokens[b, 1:] = top[parents_of[b], ranks_of[b]]
    return tokens.to(torch.int32)


def uniforms(batch: int, n: int, seed: int, device=None) -> torch.Tensor:
    """(B, N) float32 uniforms in [0, 1)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand((batch, n), generator=generator, dtype=torch.float32).to(device)


@dataclass
class SamplingCase:
    """One batch of trees with everything the walk needs (CPU tensors)."""

    name: str
    parents: list[list[int]]
    tokens: torch.Tensor
    q: torch.Tensor
    p: torch.Tensor
    accept: torch.Tensor
    sample: torch.Tensor
    as_times: bool = False  # hand the kernel DFS times instead of parents
    exact: bool = False  # every sum is exact in float64 (dyadic inputs): no rounding excuse
    replacement: bool = False  # children drawn independently (SpecInfer), not without replacement

    def tree_args(self, b: int) -> tuple:
        """Tree b's arguments of `pyspec_ref.sampling.tree_speculative_sampling`, as lists."""
        return (self.parents[b], self.tokens[b].tolist(), self.q[b].tolist(), self.p[b].tolist(),
                self.accept[b].tolist(), self.sample[b].tolist())

    def tree(self, device):
        if self.as_times:
            return tuple(t.to(device) for t in inputs.dfs_times_tensors(self.parents))
        return inputs.batch_of_trees(self.parents, device)

    def run(self, module, device):
        return module.tree_speculative_sampling(
            self.tree(device), self.tokens.to(device), self.q.to(device), self.p.to(device),
            self.accept.to(device), self.sample.to(device), replacement=self.replacement)


def sampling_case(name: str, trees, vocabulary: int, seed: int, *, as_times: bool = False,
                  zero_fraction: float = 0.1, mismatch: float = 1.0,
                  replacement: bool = False) -> SamplingCase:
    """Random distributions at every node, tokens drawn from the parents' q (without replacement
    unless `replacement`), random uniforms."""
    parents = inputs.batch_of_trees(trees)
    batch, n = parents.shape
    q, p = draft_and_target(batch, n, vocabulary, seed, mismatch=mismatch)
    if zero_fraction:
        q = _with_zeros(q, zero_fraction, seed + 2)
    tokens = draft_tokens(parents, q, seed + 3, replacement)
    return SamplingCase(name, [list(t) for t in parents.tolist()], tokens, q, p,
                        uniforms(batch, n, seed + 4), uniforms(batch, n, seed + 5), as_times,
                        replacement=replacement)


def _with_zeros(q: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    """q with a share of its entries set to 0 (never a row's largest), renormalised."""
    generator = torch.Generator().manual_seed(seed)
    drop = torch.rand(q.shape, generator=generator) < fraction
    drop &= q < q.max(dim=-1, keepdim=True).values
    q = q.double().masked_fill(drop, 0.0)
    return (q / q.sum(dim=-1, keepdim=True)).to(torch.float32)


def _drawn(build, name: str, trees, vocabulary: int, seed: int, **options):
    """build(name, trees, vocabulary, the case's seed, **options), a case of a check: everything in it is
    drawn from its own seed, `inputs.case_seed(seed, name)`; `trees` are the trees, or a function that
    draws them from a random.Random of that seed plus TREES_OFFSET."""
    drawn = inputs.case_seed(seed, name)
    if callable(trees):
        trees = trees(random.Random(drawn + TREES_OFFSET))
    return build(name, trees, vocabulary, drawn, **options)


TREES_OFFSET = 8  # past the offsets the case builders add to a case's seed (0 to 7)


def _random_trees(n: int, count: int = 2, max_children: int = 3, orders=None):
    """A function drawing `count` random trees of n nodes (in `orders`, else BFS) from an rng."""
    orders = orders or ["bfs"] * count
    return lambda rng: [inputs.random_tree(n, rng, max_children=max_children, order=o) for o in orders]


# --------------------------------------------------------------------------- the reference walk


def rounding_bound(vocabulary: int, rejections: int) -> float:
    """Relative distance from a threshold within which float64 sums over the vocabulary (the
    kernel's tiles vs the specification's exact sums) can flip a comparison, after `rejections`
    rejections at the node: a generous V * 2^-53 per sum, one more sum per rejection."""
    return 64.0 * vocabulary * UNIT_ROUNDOFF * (rejections + 1)


@dataclass(frozen=True)
class Near:
    """A decision of the walk within rounding of its threshold: a test or residual at `node`
    (the kernel may take the other branch there), or the final draw (then the kernel may draw
    one of `alternatives`, the tokens on either side of the boundary)."""

    node: int
    what: str
    alternatives: frozenset[int] | None = None  # None for tests and residuals


@dataclass
class ReferenceWalk:
    """The specification's walk on one tree, with the decisions that lie within rounding."""

    path: list[int]
    token: int
    near: list[Near] = field(default_factory=list)

    def explains(self, path: list[int], token: int) -> Near | None:
        """The near decision that explains a kernel result differing from this walk, or None:
        a path that leaves this one at a node with a near test or residual, or this path with
        a token on the other side of a near CDF boundary of the draw."""
        common = 0
        while common < min(len(path), len(self.path)) and path[common] == self.path[common]:
            common += 1
        if common == len(path) == len(self.path):
            return next((n for n in self.near if n.alternatives is not None and token in n.alternatives),
                        None)
        node = self.path[common - 1]
        return next((n for n in self.near if n.alternatives is None and n.node == node), None)


def _draw_near(weights: list[float], u: float, bound: float) -> tuple[str, frozenset[int]] | None:
    """None unless u * total lies within bound * total of a boundary of the exact CDF; else what
    and the tokens on both sides of those boundaries."""
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    threshold = Fraction(u) * total
    positive = [i for i, w in enumerate(exact) if w]
    cumulative, sides, what = Fraction(0), set(), ""
    for index, i in enumerate(positive):
        cumulative += exact[i]
        if abs(cumulative - threshold) <= Fraction(bound) * total:
            sides.update(positive[index:index + 2])
            what = what or (f"the draw: u * total is within {float(abs(cumulative - threshold) / total):.2g}"
                            f" (relative) of the CDF boundary after token {i}")
    return (what, frozenset(sides)) if sides else None


def _children(parents) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parents]
    for node in range(1, len(parents)):
        kids[parents[node]].append(node)
    return kids


def _residual_total(p_i: list[float], q_i: list[float]) -> float:
    return math.fsum(max(0.0, a - b) for a, b in zip(p_i, q_i, strict=True))


def reference_walk(parents, tokens, q, p, accept, sample, replacement: bool = False) -> ReferenceWalk:
    """`pyspec_ref.sampling.tree_speculative_sampling` replayed step by step (the same
    `sibling_distributions`), listing every decision the kernel's float64 sums could flip:
    a test after a rejection at the node, an empty-or-not residual after an earlier rejection,
    and the final draw. The first test at a node is exact and never listed. Tolerances are
    relative to p's scale: p_i = max(0, p - C q) / Z, so an error in p of a given size is 1/Z
    times larger in p_i (z below tracks Z_i as the product of the residuals' masses)."""
    vocabulary, children = len(p[0]), _children(parents)
    walk = ReferenceWalk([0], -1)
    node = 0
    while True:
        kids = children[node]
        steps = spec.sibling_distributions(p[node], q[node], [tokens[c] for c in kids],
                                           replacement=replacement)
        z, moved = 1.0, False
        for rejected, child in enumerate(kids):
            (p_i, q_i), x = steps[rejected], tokens[child]
            lhs, rhs = accept[child] * q_i[x], p_i[x]
            # q_i = q / S: the kernel's S (a total minus the drawn mass) is off by rounding of 1
            left = q[node][x] / q_i[x] if q_i[x] > 0.0 else 1.0
            scale = max(lhs, rhs, q_i[x], p[node][x] / z) / min(1.0, left)
            if rejected and abs(lhs - rhs) <= rounding_bound(vocabulary, rejected) * scale:
                walk.near.append(Near(node, f"node {node}, child {child}: r q_i(x) = {lhs:.17g} is within "
                                            f"rounding of p_i(x) = {rhs:.17g} after {rejected} rejections"))
            if spec.sibling_accepts(accept[child], p_i, q_i, x):
                walk.path.append(child)
                node, moved = child, True
                break
            total = _residual_total(p_i, q_i)
            if rejected and total * z <= rounding_bound(vocabulary, rejected):
                walk.near.append(Near(node, f"node {node}: the residual after {rejected + 1} rejections "
                                            f"has mass {total * z:.3g}, within rounding of empty"))
            if steps[rejected + 1][0] is not p_i:  # the residual replaced p_i (not kept)
                z *= total
        if not moved:
            final = steps[len(kids)][0]
            walk.token = spec.inverse_cdf(final, sample[node])
            bound = rounding_bound(vocabulary, len(kids)) / min(1.0, z)
            near = _draw_near(final, sample[node], bound)
            if near:
                walk.near.append(Near(node, f"node {node}: {near[0]}", near[1]))
            return walk


def explain_walk(parents, tokens, q, p, accept, sample, replacement: bool = False) -> list[str]:
    """The specification's walk on one tree in words, one line per decision (for notebook 16):
    each child's test r * q_i(x) < p_i(x) with its numbers, each residual, and the draw."""
    lines, node, children = [], 0, _children(parents)
    while True:
        kids = children[node]
        steps = spec.sibling_distributions(p[node], q[node], [tokens[c] for c in kids],
                                           replacement=replacement)
        moved = False
        for i, child in enumerate(kids):
            (p_i, q_i), x = steps[i], tokens[child]
            lhs, rhs = accept[child] * q_i[x], p_i[x]
            accepted = spec.sibling_accepts(accept[child], p_i, q_i, x)
            lines.append(f"node {node}: child {child} (token {x}): r q_{i + 1}(x) = {accept[child]:.3f} x "
                         f"{q_i[x]:.3f} = {lhs:.3f} vs p_{i + 1}(x) = {rhs:.3f} -> "
                         f"{'accept' if accepted else 'reject'}")
            if accepted:
                node, moved = child, True
                break
            if steps[i + 1][0] is p_i:
                lines.append(f"node {node}: max(0, p_{i + 1} - q_{i + 1}) is empty (or no draft mass is "
                             "left): the state is kept")
            else:
                removed = "" if replacement else f", q_{i + 2} = q without the drawn tokens, renormalised"
                lines.append(f"node {node}: p_{i + 2} = max(0, p_{i + 1} - q_{i + 1}) / "
                             f"{_residual_total(p_i, q_i):.3f}{removed}")
        if not moved:
            why = "a leaf" if not kids else "every child rejected"
            token = spec.inverse_cdf(steps[len(kids)][0], sample[node])
            lines.append(f"node {node} ({why}): draw with u = {sample[node]:.3f} -> token {token}")
            return lines


# --------------------------------------------------------------------------- comparison


@dataclass
class SamplingComparison:
    """How a batch of kernel results compares with the specification, tree by tree."""

    trees: int = 0
    exact: int = 0
    within_rounding: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    diagnosis: str = ""  # the known mistake that reproduces the kernel's results, if one does

    @property
    def allowed_within_rounding(self) -> int:
        return max(1, int(ROUNDING_SHARE * self.trees))

    def problem(self) -> str:
        """'' when every tree is exact or within rounding (and those are few)."""
        if self.wrong:
            more = f" (and {len(self.wrong) - 1} more trees)" if len(self.wrong) > 1 else ""
            return self.wrong[0] + more + (f". {self.diagnosis}" if self.diagnosis else "")
        if len(self.within_rounding) > self.allowed_within_rounding:
            return (f"{len(self.within_rounding)} of {self.trees} trees differ within rounding, more "
                    f"than the {self.allowed_within_rounding} allowed: {self.within_rounding[0]}")
        return ""

    def summary(self) -> str:
        return (f"{self.trees} trees: {self.exact} exactly as pyspec_ref, {len(self.within_rounding)} "
                f"within rounding, {len(self.wrong)} wrong")


def _divergence(got_path, got_token, want_path, want_token, parents, tokens, q, p, accept) -> str:
    """Where the kernel's walk left the specification's, in words."""
    common = 0
    while common < min(len(got_path), len(want_path)) and got_path[common] == want_path[common]:
        common += 1
    if common == len(got_path) == len(want_path):
        return (f"same path, but next token {got_token} instead of {want_token} (the draw at node "
                f"{got_path[-1]})")
    node = want_path[common - 1]
    if common < len(got_path) and parents[got_path[common]] != node:
        return f"the path's node {got_path[common]} is not a child of node {node}"
    took = f"went on to node {got_path[common]}" if common < len(got_path) else "stopped"
    should = f"go on to node {want_path[common]}" if common < len(want_path) else "stop and draw"
    first = next((c for c in range(1, len(parents)) if parents[c] == node), None)
    hint = ""
    if first is not None:
        x = tokens[first]
        hint = (f"; its first child {first} has token {x}: r = {accept[first]:.9g}, q(x) = "
                f"{q[node][x]:.9g}, p(x) = {p[node][x]:.9g}, accepted iff r q(x) < p(x)")
    return f"at node {node} the kernel {took}, the specification would {should}{hint}"


def compare_sampling(case: SamplingCase, path: torch.Tensor, next_token: torch.Tensor) -> SamplingComparison:
    """Compare a kernel's (path, next_token) with pyspec_ref on every tree of the case (a case
    marked exact allows no difference at all)."""
    result = SamplingComparison()
    path, next_token = path.cpu(), next_token.cpu()
    batch, n = case.tokens.shape
    if tuple(path.shape) != (batch, n) or tuple(next_token.shape) != (batch,):
        result.trees = batch
        result.wrong.append(f"path has shape {tuple(path.shape)} and next_token {tuple(next_token.shape)},"
                            f" expected {(batch, n)} and {(batch,)}")
        return result
    for b in range(batch):
        result.trees += 1
        args = case.tree_args(b)
        want_path, want_token = spec.tree_speculative_sampling(*args, replacement=case.replacement)
        row = path[b].tolist()
        got_path = [x for x in row if x >= 0]
        got_token = int(next_token[b])
        if row != got_path + [-1] * (n - len(got_path)):
            result.wrong.append(f"tree {b}: path row {row} is not node ids followed by -1 padding")
            continue
        if (got_path, got_token) == (want_path, want_token):
            result.exact += 1
            continue
        walk = reference_walk(*args, replacement=case.replacement)
        if (walk.path, walk.token) != (want_path, want_token):
            raise AssertionError("reference_walk disagrees with pyspec_ref: a bug in the check")
        near = None if case.exact else walk.explains(got_path, got_token)
        if near is not None:
            result.within_rounding.append(f"tree {b}: {near.what}")
        else:
            result.wrong.append(
                f"tree {b}: path {got_path}, next token {got_token}; expected path {want_path}, next "
                f"token {want_token}: " + _divergence(got_path, got_token, want_path, want_token, *args[:5]))
    if result.wrong:
        result.diagnosis = diagnose(case, path, next_token)
    return result


# --------------------------------------------------------------------------- diagnosis


@dataclass(frozen=True)
class Mistake:
    """A known way to get the walk's closed form wrong: what the kernel then does, and the fix."""

    says: str
    decrement: bool | None = None  # S <- S - q(x) on a rejection; None: as the mode says
    c_step_divides: bool = True  # C <- C + Z / S (False: C <- C + Z)
    test_has_s: bool = True  # r q(x) Z < S max(0, p(x) - C q(x))
    test_has_z: bool = True
    reset_on_accept: bool = True
    s_from_total: bool = True  # S_2 = Q - q(x_1), Q = sum of q (False: 1 - q(x_1))


MISTAKES = (
    Mistake("S (the draft mass not yet drawn) is never decremented: the siblings are tested as if drawn "
            "with replacement; on a rejection S <- S - q(x)", decrement=False),
    Mistake("S is decremented although the children were drawn with replacement (REPLACEMENT): then q_i "
            "= q and S stays 1", decrement=True),
    Mistake("S after the first rejection is taken as 1 - q(x) instead of Q - q(x) with Q = sum q (which "
            "residual_mass returns): q sums to 1 only within rounding and the later tests divide by S",
            s_from_total=False),
    Mistake("C is advanced by Z instead of Z / S: q_i = q / S, so the residual max(0, p_i - q_i) is "
            "max(0, p - (C + Z / S) q) / Z", c_step_divides=False),
    Mistake("the test leaves out S: q_i(x) = q(x) / S, so r q_i(x) < p_i(x) reads r q(x) Z < S max(0, p(x) "
            "- C q(x))", test_has_s=False),
    Mistake("the test leaves out Z, the residual's normalisation: p_i = max(0, p - C q) / Z",
            test_has_z=False),
    Mistake("the state (C, Z, S) is not reset after an accepted child: the child's own p and q start "
            "afresh, C = 0, Z = S = 1", reset_on_accept=False),
)


def closed_form_walk(parents, tokens, q, p, accept, sample, replacement: bool,
                     mistake: Mistake | None = None) -> tuple[list[int], int]:
    """The kernel's walk in Python floats (the closed form of solutions/tree_verification.py), or
    with one known mistake: (path, next token), the token -1 if the mistake leaves nothing to draw."""
    m = mistake or Mistake("")
    decrement = (not replacement) if m.decrement is None else m.decrement
    children, path, node = _children(parents), [0], 0
    c, z, s = 0.0, 1.0, 1.0
    while True:
        moved = False
        for child in children[node]:
            x = tokens[child]
            q_x, p_x = q[node][x], p[node][x]
            if accept[child] * q_x * (z if m.test_has_z else 1.0) < (s if m.test_has_s else 1.0) * max(
                    p_x - c * q_x, 0.0):
                path.append(child)
                node, moved = child, True
                if m.reset_on_accept:
                    c, z, s = 0.0, 1.0, 1.0
                break
            if s > 0.0:
                c_next = c + (z / s if m.c_step_divides else z)
                z_next = math.fsum(max(0.0, a - c_next * b) for a, b in zip(p[node], q[node], strict=True))
                if z_next > 0.0:
                    if decrement:  # the first rejection (C = 0) takes the mass left from q's total
                        s = (math.fsum(q[node]) if c == 0.0 and m.s_from_total else s) - q_x
                    c, z = c_next, z_next
        if not moved:
            weights = [max(0.0, a - c * b) for a, b in zip(p[node], q[node], strict=True)]
            return path, spec.inverse_cdf(weights, sample[node]) if any(weights) else -1


def diagnose(case: SamplingCase, path: torch.Tensor, next_token: torch.Tensor) -> str:
    """'Every tree ... comes out as the walk gives it when <mistake>' for the known mistakes that
    reproduce the kernel's (path, next token) on every tree of the case (several when this case
    cannot tell them apart), or ''."""
    got = [([x for x in path[b].tolist() if x >= 0], int(next_token[b])) for b in range(len(case.parents))]
    matching = []
    for mistake in MISTAKES:
        if mistake.decrement is not None and mistake.decrement == (not case.replacement):
            continue  # the mode's own rule, not a mistake
        if all(closed_form_walk(*case.tree_args(b), case.replacement, mistake) == got[b]
               for b in range(len(case.parents))):
            matching.append(mistake.says)
    if not matching:
        return ""
    mode = "with" if case.replacement else "without"
    return (f"Every tree of this case ({mode} replacement) comes out as the walk gives it when "
            + "; or when ".join(matching))


# --------------------------------------------------------------------------- the cases


def _special_cases(vocabulary: int, seed: int) -> list[SamplingCase]:
    """Edge cases whose inputs are built by hand on top of random ones (each from its own seed)."""
    cases = []
    # All children rejected: tokens where the draft over-proposes (q(x) > 1.01 p(x)), r near 1.
    case = _drawn(sampling_case, "star N=6, every child rejected: draw from the residual",
                  [inputs.star(6)] * 2, vocabulary, seed)
    for b in range(2):
        ratio = case.q[b, 0].double() / case.p[b, 0].double().clamp(min=1e-30)
        over = torch.nonzero(ratio > 1.01).flatten()
        for i in range(1, 6):
            case.tokens[b, i] = int(over[(i - 1 + 3 * b) % len(over)])  # distinct siblings
    case.accept.fill_(0.9999)
    cases.append(case)
    # r = 0 accepts every first child: the walk reaches a leaf and draws from its p.
    case = _drawn(sampling_case, "random tree N=12, r = 0: all accepted down to a leaf", _random_trees(12),
                  vocabulary, seed)
    case.accept.zero_()
    cases.append(case)
    # q(x) = 0 for the draft token: r * 0 < p(x) accepts, whatever r (p(x) > 0 here).
    case = _drawn(sampling_case, "chain N=5, q(x) = 0 for every draft token: all accepted",
                  [inputs.chain(5)] * 2, vocabulary, seed)
    q = case.q.double()
    for b in range(2):
        for i in range(1, 5):
            q[b, i - 1, int(case.tokens[b, i])] = 0.0
    case.q = (q / q.sum(dim=-1, keepdim=True)).to(torch.float32)
    case.accept.fill_(0.9999)
    cases.append(case)
    # p <= q everywhere at the root (q = 1.0001 p, normalised within tolerance): a child can be
    # rejected (r q(x) > p(x) for r > 1/1.0001) and leaves an empty residual, so p is kept.
    case = _drawn(sampling_case, "star N=4, p <= q everywhere: rejections leave an empty residual, p is kept",
                  [inputs.star(4)] * 2, vocabulary, seed)
    case.q[:, 0] = (case.p[:, 0].double() * 1.0001).to(torch.float32)
    case.accept.fill_(0.99995)
    cases.append(case)
    # p = q at the root: every child is accepted (r < 1), so the walk always moves on.
    case = _drawn(sampling_case, "star N=5, p = q at the root: the first child is accepted",
                  [inputs.star(5)] * 2, vocabulary, seed)
    case.q[:, 0] = case.p[:, 0]
    cases.append(case)
    # Siblings with the same token (drawn with replacement): after rejecting x, p'(x) =
    # max(0, p(x) - q(x)) / Z = 0 when    # q(x) >= p(x), so the duplicate is rejected too.
    case = _drawn(sampling_case, "star N=5 drawn with replacement, all children the same token",
                  [inputs.star(5)] * 2, vocabulary, seed, replacement=True)
    case.tokens[:, 2:] = case.tokens[:, 1:2]
    cases.append(case)
    # Ties in the draw: dyadic probabilities with zeros between them, u * total exactly on a CDF
    # boundary; the draw must take the token after the boundary (strict >) and skip zeros.
    mass = torch.zeros(vocabulary, dtype=torch.float64)
    support = list(range(0, vocabulary, 2))[:16]
    mass[support] = 1.0 / len(support)
    p = mass.to(torch.float32).expand(4, 1, vocabulary).clone()
    sample = torch.tensor([[0.0], [0.25], [0.5], [0.75]], dtype=torch.float32)
    cases.append(SamplingCase("one node N=1, u * total exactly on a CDF boundary (ties), zeros between",
                              [[-1]] * 4, torch.zeros((4, 1), dtype=torch.int32), p.clone(), p,
                              torch.zeros((4, 1)), sample, exact=True))
    cases.append(_second_child_case(vocabulary, seed))
    cases.append(_exact_test_case(vocabulary))
    cases.append(_no_mass_left_case(vocabulary))
    return cases


def peaked_wrong_draft(q: torch.Tensor, p: torch.Tensor, mass: float = 0.7) -> torch.Tensor:
    """q with `mass` of its probability moved onto the token the target likes least: a draft that
    is confidently wrong, where siblings drawn with replacement mostly repeat that token."""
    wrong = p.double().argmin(dim=-1, keepdim=True)
    q = q.double() * (1.0 - mass)
    q.scatter_add_(-1, wrong, torch.full_like(q[..., :1], mass))
    return q.to(torch.float32)


def _peaked_case(name: str, vocabulary: int, seed: int, *, replacement: bool) -> SamplingCase:
    """Stars of 4 nodes whose root draft puts 0.7 on a token the target gives little (and sums to
    1 - 9e-4, within NORMALISATION_TOLERANCE: S must come from q's total, not from 1): the first
    child is mostly that token, and r = 0.999 rejects it; in every other tree the second child
    gets r = 0.999 too, so that the third child's test and the draw come after two rejections.
    The later tests and residuals depend on S (the draft mass left) and on C's step Z / S. Where
    every child of a tree is rejected, its draw gets a uniform on a knife edge (`_near_a_boundary`:
    just below in trees 1 and 5, just above in trees 3 and 7); the tokens are drawn again until
    both kinds of knife edge occur. Drawn from the case's own seed, `inputs.case_seed(seed, name)`."""
    seed = inputs.case_seed(seed, name)
    case = sampling_case(name, [inputs.star(4)] * 8, vocabulary, seed, mismatch=0.5, replacement=replacement)
    # q sums to 1 - 9e-4 (within the tolerance): S after a draw must come from q's total, not 1
    case.q = (peaked_wrong_draft(case.q, case.p).double() * (1 - 9e-4)).to(torch.float32)
    case.accept[:, 1] = 0.999
    case.accept[1::2, 2:] = 0.999
    for attempt in range(PEAKED_DRAWS):
        case.tokens = draft_tokens(inputs.batch_of_trees(case.parents), case.q, seed + 7 + 16 * attempt,
                                   replacement)
        rejected = [b for b in range(1, len(case.parents), 2)
                    if spec.tree_speculative_sampling(*case.tree_args(b), replacement=replacement)[0] == [0]]
        if {b % 4 for b in rejected} == {1, 3}:
            break
    else:
        raise RuntimeError(f"{name}: no draw of {PEAKED_DRAWS} rejects every child of two trees")
    for b in rejected:  # where every child is rejected, the draw on a knife edge
        case.sample[b, 0] = _near_a_boundary(case, b, replacement, below=b % 4 == 1)
    return case


PEAKED_DRAWS = 64  # draws of a peaked case's tokens, at most: each rejects all of a tree's children often


def _near_a_boundary(case: SamplingCase, b: int, replacement: bool, below: bool) -> float:
    """A uniform 10^-6 below (or above) the CDF boundary after the middle token with mass of the
    root's final distribution in tree b: a draw whose weights are off by more than that (a wrong
    C or Z) takes the token on the other side."""
    kids = [c for c in range(1, len(case.parents[b])) if case.parents[b][c] == 0]
    steps = spec.sibling_distributions(case.p[b, 0].tolist(), case.q[b, 0].tolist(),
                                       [int(case.tokens[b, c]) for c in kids], replacement=replacement)
    final = steps[-1][0]
    support = [v for v, w in enumerate(final) if w > 0.0]
    if len(support) < 2:  # one token: no boundary inside (0, 1)
        return float(case.sample[b, 0])
    boundary = math.fsum(final[: support[len(support) // 2 - 1] + 1]) / math.fsum(final)
    return boundary - 1e-6 if below else boundary + 1e-6


def _no_mass_left_case(vocabulary: int) -> SamplingCase:
    """A root draft on two tokens (3/4, 1/4, dyadic: S is exactly 0 after both) that the target
    forbids, and a third sibling with q(x) = 0: r = 0 rejects the first two (p(x) = 0), leaving
    p; the third finds S = 0, no draft mass left, and is rejected (the walk keeps C, Z: a
    division by S = 0 would make C infinite and the draw NaN); the next token is drawn from p."""
    q = torch.zeros((2, 4, vocabulary), dtype=torch.float64)
    q[:, :, 0], q[:, :, 1] = 0.75, 0.25
    p = torch.zeros((2, 4, vocabulary), dtype=torch.float64)
    p[:, :, 2:10] = 1 / 8
    tokens = torch.tensor([[0, 0, 1, 5], [0, 1, 0, 9]], dtype=torch.int32)
    sample = torch.tensor([[0.3] * 4, [0.9] * 4], dtype=torch.float32)
    return SamplingCase("star N=4, S = 0 at the third sibling: no draft mass left, rejected",
                        [inputs.star(4)] * 2, tokens, q.to(torch.float32), p.to(torch.float32),
                        torch.zeros((2, 4)), sample, exact=True)


def _exact_test_case(vocabulary: int) -> SamplingCase:
    """The test r q(x) < p(x) at its boundary, with dyadic inputs (every sum exact): tree 0 has
    r q(x) = p(x) exactly (rejected: the test is strict); tree 1 has r q(x) below p(x) by less
    than half a float32 ulp, which a float32 product would round up to p(x) (accepted); tree 2
    has q(x) = p(x) = 0 (rejected: 0 < 0 is false, the target forbids the token even for r = 0)."""
    p = torch.zeros((3, 2, vocabulary), dtype=torch.float64)
    q = torch.zeros((3, 2, vocabulary), dtype=torch.float64)
    p[:, :, :16] = 1 / 16
    q[:, :, :8] = 1 / 8
    x = 3
    p[1, 0, x] = (1 + 2.0 ** -23) / 16  # r q(x) = (1 + 2^-23 - 2^-45) / 16
    q[1, 0, x] = (1 + 2.0 ** -22) / 8
    tokens = torch.tensor([[0, x], [0, x], [0, 20]], dtype=torch.int32)
    accept = torch.tensor([[0.0, 0.5], [0.0, 0.5 * (1 - 2.0 ** -23)], [0.0, 0.0]], dtype=torch.float32)
    return SamplingCase("chain N=2: r q(x) = p(x) exactly, below it by 2^-45 relative, and q(x) = p(x) = 0",
                        [inputs.chain(2)] * 3, tokens, q.to(torch.float32), p.to(torch.float32), accept,
                        torch.full((3, 2), 0.3), exact=True)


def _second_child_case(vocabulary: int, seed: int) -> SamplingCase:
    """A root with two children: the first is rejected; the second's token y has p(y) > q(y),
    and its r lies between the unnormalised and the renormalised residual's acceptance ratio,
    S w(y)/q(y) < r < S w(y)/(q(y) Z) with w = max(0, p - q), Z = sum(w), S = 1 - q(first
    token): accepted only if the test uses the renormalised residual p_2 = w / Z (tree 0); tree
    1 takes r above both (rejected). Drawn from the case's own seed (`_drawn`)."""
    case = _drawn(sampling_case, "star N=3: the second child is tested against the renormalised residual",
                  [inputs.star(3)] * 2, vocabulary, seed)
    for b in range(2):
        p, q = case.p[b, 0].double(), case.q[b, 0].double()
        ratio = q / p
        case.tokens[b, 1] = int(torch.argmax(ratio))  # the most over-proposed token: rejected
        w = (p - q).clamp(min=0.0)
        z = float(w.sum())
        # without replacement the second child is tested against q / S, S = 1 - q(first token)
        left = 1.0 - float(q[case.tokens[b, 1]])
        # the token whose acceptance ratio changes most between S w/q and S w/(q Z), below 1
        low = left * w / q.clamp(min=1e-30)
        high = (left * w / (q.clamp(min=1e-30) * z)).clamp(max=1.0)
        if b == 0:
            y = int(torch.argmax(torch.where(q > 0, high - low, torch.zeros_like(low))))
            r = (float(low[y]) + float(high[y])) / 2
        else:  # a token whose renormalised ratio is below 1, and an r above it
            y = int(torch.argmax(torch.where((w > 0) & (high < 0.99), high, -torch.ones_like(high))))
            r = (float(high[y]) + 1.0) / 2
        case.tokens[b, 2] = y
        case.accept[b, 1], case.accept[b, 2] = 0.9999, r
    return case


def sampling_cases(seed: int) -> list[SamplingCase]:
    """The fixed edge cases, then fresh random trees, each case drawn from its own seed (`_drawn`)."""
    ragged = runtime.pick(sim=37, gpu=2500)  # not a multiple of any tile
    whole = runtime.pick(sim=32, gpu=16384)  # a multiple of every tile
    cases = [
        _drawn(sampling_case, "one node N=1 (only the draw)", [[-1]] * 2, ragged, seed),
        _drawn(sampling_case, "chain N=5 (gamma = 4)", [inputs.chain(5)] * 3, ragged, seed),
        _drawn(sampling_case, "star N=9: eight candidates at the root", [inputs.star(9)] * 3, ragged, seed,
               mismatch=2.0),
        _drawn(sampling_case, f"random trees N=10, V={whole} (a multiple of the tile)", _random_trees(10),
               whole, seed),
        _drawn(sampling_case, "random trees N=10 given as DFS times",
               _random_trees(10, orders=("bfs", "dfs")), ragged, seed, as_times=True),
        *_special_cases(ragged, seed),
        _peaked_case("star N=4 without replacement, a draft peaked on a wrong token", ragged, seed,
                     replacement=False),
        _peaked_case("star N=4 with replacement, a draft peaked on a wrong token", ragged, seed,
                     replacement=True),
    ]
    big = runtime.pick(sim=100, gpu=32000)
    cases.append(_drawn(sampling_case, f"random trees N=16, V={big}", _random_trees(16, 3, max_children=4),
                        big, seed, mismatch=1.5))
    return cases


def check_tree_sampling(module, seed: int):
    """module.tree_speculative_sampling must equal pyspec_ref on every tree, with the case's
    `replacement` (siblings drawn without replacement, or with in the cases that say so), or
    differ only within rounding, rarely; run twice with the same result; a chain must give
    pyspec_ref.speculative_sampling's result. A failing case names the known mistake that
    reproduces it, if one does (`diagnose`)."""
    device = runtime.torch_device()
    for case in sampling_cases(seed):
        def run(case=case):
            got = case.run(module, device)
            again = case.run(module, device)
            comparison = compare_sampling(case, *got)
            problem = comparison.problem() or rerun_problem(got, again)
            if not problem and case.name.startswith("chain"):
                problem = _chain_problem(case, *got)
            return CaseResult(case.name, False, problem) if problem else None
        yield case.name, run


def _chain_problem(case: SamplingCase, path: torch.Tensor, next_token: torch.Tensor) -> str:
    """A chain tree must give what chain speculative sampling gives on the same numbers: node
    c + 1 holds draft token c, tested with accept[c + 1], drawn at node c with sample[c]."""
    for b in range(len(case.parents)):
        n = len(case.parents[b])
        accepted, emitted = spec.speculative_sampling(
            case.tokens[b, 1:].tolist(), case.q[b, : n - 1].tolist(), case.p[b].tolist(),
            case.accept[b, 1:].tolist(), case.sample[b].tolist())
        got = int((path[b] >= 0).sum()) - 1
        if got != accepted or int(next_token[b]) != emitted[accepted]:
            return (f"tree {b}: the chain accepted {got} and drew {int(next_token[b])}; chain speculative "
                    f"sampling accepts {accepted} and emits {emitted}")
    return ""


# --------------------------------------------------------------------------- greedy


def first_argmax(row: list[float]) -> int:
    """The first index of the largest value (torch.argmax's rule on ties)."""
    best = max(row)
    return row.index(best)


@dataclass
class GreedyCase:
    name: str
    parents: list[list[int]]
    tokens: torch.Tensor
    target: torch.Tensor  # (B, N, V) floats, or (B, N) int32 argmax ids
    as_times: bool = False

    def expected_argmax(self) -> list[list[int]]:
        if self.target.dim() == 2:
            return self.target.tolist()
        return [[first_argmax(row) for row in tree] for tree in self.target.float().tolist()]


def greedy_case(name: str, trees, vocabulary: int, seed: int, *, match: float = 0.7,
                dtype=torch.float32, ties: bool = False, as_times: bool = False) -> GreedyCase:
    """Random target scores; each node's children get the target's argmax as one child's token
    with probability `match` (else random tokens), so that paths of several nodes occur."""
    rng = random.Random(seed)
    parents = inputs.batch_of_trees(trees)
    batch, n = parents.shape
    target = inputs.random_tensor((batch, n, vocabulary), seed, torch.float32)
    if ties:  # the maximum twice in each row: at its place and at a later (or earlier) index
        for b in range(batch):
            for i in range(n):
                j = rng.randrange(vocabulary)
                target[b, i, j] = target[b, i].max()
    target = target.to(dtype)
    best = [[first_argmax(row) for row in tree] for tree in target.float().tolist()]
    tokens = torch.randint(0, vocabulary, (batch, n), generator=torch.Generator().manual_seed(seed),
                           dtype=torch.int32)
    for b, tree in enumerate(parents.tolist()):
        for node in range(n):
            kids = [c for c in range(n) if tree[c] == node]
            if kids and rng.random() < match:
                tokens[b, rng.choice(kids)] = best[b][node]
    return GreedyCase(name, [list(t) for t in parents.tolist()], tokens, target, as_times)


def greedy_cases(seed: int) -> list[GreedyCase]:
    """Greedy cases, each drawn from its own seed (`_drawn`)."""
    ragged = runtime.pick(sim=37, gpu=2500)
    whole = runtime.pick(sim=32, gpu=16384)  # a multiple of every tile
    cases = [
        _drawn(greedy_case, "one node N=1", [[-1]] * 2, ragged, seed),
        _drawn(greedy_case, "chain N=6, every token the argmax: the whole chain", [inputs.chain(6)] * 2,
               ragged, seed, match=1.0),
        _drawn(greedy_case, f"random trees N=12, V={whole} (a multiple of the tile)", _random_trees(12),
               whole, seed),
        _drawn(greedy_case, "random trees N=12, the maximum twice in every row (ties: the first index)",
               _random_trees(12), ragged, seed, ties=True),
        _drawn(greedy_case, "random trees N=10, float16 scores", _random_trees(10), ragged, seed,
               dtype=torch.float16),
        _drawn(greedy_case, "random trees N=10 given as DFS times", _random_trees(10, orders=("bfs", "dfs")),
               ragged, seed, as_times=True),
    ]
    star = _drawn(greedy_case, "star N=7, two children with the argmax token: the first is taken",
                  [inputs.star(7)] * 2, ragged, seed, match=0.0)
    best = star.expected_argmax()
    for b in range(2):
        star.tokens[b, 3] = star.tokens[b, 5] = best[b][0]
    cases.append(star)
    given = _drawn(greedy_case, "random trees N=12, argmax ids given (int32)", _random_trees(12), ragged,
                   seed)
    given.target = torch.tensor(given.expected_argmax(), dtype=torch.int32)
    cases.append(given)
    return cases


def check_greedy_verification(module, seed: int):
    """module.greedy_tree_verification must equal pyspec_ref.greedy_tree_verification on the
    target's argmax (first index on ties), and the given target_argmax that argmax."""
    from course.topics.verification.launch import target_argmax

    device = runtime.torch_device()
    for case in greedy_cases(seed):
        def run(case=case):
            tree = (tuple(t.to(device) for t in inputs.dfs_times_tensors(case.parents)) if case.as_times
                    else inputs.batch_of_trees(case.parents, device))
            target = case.target.to(device)
            got = module.greedy_tree_verification(tree, case.tokens.to(device), target, lazy=False)
            again = module.greedy_tree_verification(tree, case.tokens.to(device), target, lazy=False)
            best = case.expected_argmax()
            if case.target.dim() == 3:
                found = target_argmax(target).cpu().tolist()
                if found != best:
                    b, i = next((b, i) for b in range(len(best)) for i in range(len(best[b]))
                                if found[b][i] != best[b][i])
                    return CaseResult(case.name, False, f"tree {b}, node {i}: target_argmax = {found[b][i]}, "
                                      f"expected {best[b][i]} (the first index of the maximum)")
            # Lazily (the argmax taken inside the walk) only where there are scores to take it from.
            lazily = (module.greedy_tree_verification(tree, case.tokens.to(device), target, lazy=True)
                      if case.target.dim() == 3 else got)
            for how, (path, next_token) in (("", got), (" (lazy=True)", lazily)):
                path, next_token = path.cpu(), next_token.cpu()
                for b, parents in enumerate(case.parents):
                    want_path, want_token = spec.greedy_tree_verification(parents, case.tokens[b].tolist(),
                                                                          best[b])
                    row = path[b].tolist()
                    expected_row = want_path + [-1] * (len(parents) - len(want_path))
                    if row != expected_row or int(next_token[b]) != want_token:
                        why = _greedy_divergence(row, expected_row, parents, case.tokens[b].tolist(), best[b])
                        return CaseResult(case.name, False,
                                          f"tree {b}{how}: path {row}, next token {int(next_token[b])}; "
                                          f"expected path {expected_row}, next token {want_token}: {why}")
            problem = rerun_problem(got, again)
            return CaseResult(case.name, False, problem) if problem else None
        yield case.name, run


def _greedy_divergence(row: list[int], expected: list[int], parents, tokens, best) -> str:
    """Where a greedy path leaves the specification's, in words: the first position that differs."""
    if len(row) != len(expected):
        return f"the path row has {len(row)} entries, one per node ({len(expected)})"
    i = next((i for i, (got, want) in enumerate(zip(row, expected, strict=True)) if got != want), None)
    if i is None:
        last = expected[max(j for j, node in enumerate(expected) if node >= 0)]
        return f"same path, but the next token must be the target's argmax at node {last}, {best[last]}"
    if i == 0:
        return f"path[0] = {row[0]}, but every path starts at the root, node 0"
    node = expected[i - 1]
    went = f"path[{i}] = {row[i]}" if row[i] != -1 else "the walk stopped"
    if expected[i] == -1:
        return (f"at node {node} the walk must stop: no child of node {node} has its argmax token "
                f"{best[node]}; {went}")
    also = ""
    if 0 <= row[i] < len(parents) and parents[row[i]] == node and tokens[row[i]] == best[node]:
        also = f" (node {row[i]} has that token too, but ties go to the child with the smallest id)"
    return (f"at node {node} {went}, but the walk goes on to node {expected[i]}, the first child of node "
            f"{node} whose token is its argmax {best[node]}{also}")


# --------------------------------------------------------------------------- distribution test


def shifted(probabilities: list[float], shift: float) -> list[float]:
    """The distribution with `shift` of mass moved from its most to its least likely token."""
    out = list(probabilities)
    out[out.index(max(out))] -= shift
    out[out.index(min(out))] += shift
    return out


@dataclass
class DistributionTest:
    """Emitted-token counts at the first two positions of many walks, against the target."""

    samples: int
    first_counts: list[int]
    first_target: list[float]
    second_counts: list[int]
    second_target: list[float]
    mean_accepted: float = 0.0  # draft tokens accepted per walk

    def p_values(self) -> tuple[float, float]:
        """Pearson's test of both positions; tokens expected fewer than 5 times are pooled into one
        cell, as the chi-square approximation needs (a peaked target at a low temperature has
        several such tokens)."""
        return (chi_square_p_value(self.first_counts, self.first_target, pool_below=5.0),
                chi_square_p_value(self.second_counts, self.second_target, pool_below=5.0))

    def smallest_detected_shift(self, shifts=(0.005, 0.01, 0.02, 0.05, 0.1)) -> float | None:
        """The smallest shift of the first position's target (`shifted`) that these counts reject
        at SIGNIFICANCE: how large an error of the kernel this many samples would catch."""
        for shift in shifts:
            if chi_square_p_value(self.first_counts, shifted(self.first_target, shift)) < SIGNIFICANCE:
                return shift
        return None


DISTRIBUTION_TREE = [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3]  # a root with 3 children, each with 2


def distribution_inputs(samples: int, seed: int = 0, vocabulary: int = 5, *, temperature: float = 1.0,
                        peaked: float = 0.0, replacement: bool = False) -> SamplingCase:
    """`samples` independent walks on DISTRIBUTION_TREE, as one case: every depth-1 node shares
    one target p1, so the second emitted token must follow p1 whenever the first was an accepted
    draft token, and the first must follow p_root. Children's tokens are drawn from their
    parent's q as a draft model draws them (without replacement unless `replacement`); peaked:
    the share of every draft's mass moved onto the token its target likes least (0: none)."""
    n = len(DISTRIBUTION_TREE)
    # rows: the root, depth 1, the leaves
    q1, p1 = draft_and_target(1, 3, vocabulary, seed, mismatch=1.5, temperature=temperature)
    if peaked:
        q1 = peaked_wrong_draft(q1, p1, peaked)
    q = torch.stack([q1[0, 0]] + [q1[0, 1]] * 3 + [q1[0, 2]] * 6).expand(samples, n, vocabulary).contiguous()
    p = torch.stack([p1[0, 0]] + [p1[0, 1]] * 3 + [p1[0, 2]] * 6).expand(samples, n, vocabulary).contiguous()
    tree = inputs.batch_of_trees([DISTRIBUTION_TREE] * samples)
    return SamplingCase(f"{samples} walks at T = {temperature}", [list(DISTRIBUTION_TREE)] * samples,
                        draft_tokens(tree, q, seed + 1, replacement), q, p, uniforms(samples, n, seed + 2),
                        uniforms(samples, n, seed + 3), replacement=replacement)


def tally(case: SamplingCase, path: torch.Tensor, next_token: torch.Tensor) -> DistributionTest:
    """The first two emitted tokens of the walks of a `distribution_inputs` case, counted."""
    path, next_token = path.cpu(), next_token.cpu()
    samples, vocabulary = case.tokens.shape[0], case.p.shape[-1]
    first, second, accepted = [0] * vocabulary, [0] * vocabulary, 0
    for b in range(samples):
        nodes = [x for x in path[b].tolist() if x >= 0]
        emitted = [int(case.tokens[b, x]) for x in nodes[1:]] + [int(next_token[b])]
        accepted += len(nodes) - 1
        first[emitted[0]] += 1
        if len(nodes) > 1:  # the first token was an accepted draft token at a depth-1 node
            second[emitted[1]] += 1
    return DistributionTest(samples, first, case.p[0, 0].double().tolist(), second,
                            case.p[0, 1].double().tolist(), accepted / samples)


def distribution_test(module, samples: int, seed: int = 0, vocabulary: int = 5, *, temperature: float = 1.0,
                      peaked: float = 0.0, replacement: bool = False) -> DistributionTest:
    """Run the module's walk on `distribution_inputs` and count what it emits."""
    case = distribution_inputs(samples, seed, vocabulary, temperature=temperature, peaked=peaked,
                               replacement=replacement)
    return tally(case, *case.run(module, runtime.torch_device()))
