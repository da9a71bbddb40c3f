"""Checks for notebook 15's speculative sampling kernels (and the sigmoid variant's tests).

A kernel module exposes
  speculative_sampling(draft_tokens, q, p, accept_uniforms, sample_uniforms, *, from_logits, tile)
      -> (accepted (B,), emitted (B, gamma + 1))
  tile_pass(draft_tokens, q, p, accept_uniforms, *, from_logits, tile)
      -> (accept (B, gamma) bool, residual_sums (B, gamma + 1, T), target_sums (B, gamma + 1, T))
and TILE. Every case is compared with `pyspec_ref.sampling` on the same random numbers.

Exact, and where it may not be. Given probabilities, the acceptance test must be pyspec's bit for
bit (the kernel computes r * q(x) < p(x) in float64, exact for float32 inputs). A draw sums
float32 weights in float32 where pyspec sums them exactly, so a drawn token may differ where
u * total lies within float32 rounding of a CDF boundary: summed by tiles of TILE, the float32
cumulative sums and the threshold are off by at most about (TILE + T + 4) * 2^-24 * total
(`summation_depth`), plus the weights' own rounding (2^-24 relative for p - q; from logits, the
softmax's error, which grows with the logits' spread). `classify` recomputes that bound for every
mismatching draw in float64 and counts it "within rounding" only when the threshold lies inside
it; from logits an acceptance test within that error of its threshold counts the same way. Any
other difference fails, and so do more than MAX_WITHIN_ROUNDING of the samples (such draws are
rare: u * total must fall within the bound of a boundary). Cases marked strict (dyadic inputs,
whose float32 sums are exact) allow none at all.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace

import torch

from course.checks import CaseResult, rerun_problem
from course.checks.diagnose import compare_floats
from course.core import inputs, runtime
from course.oracle import sampling as sampling_oracle
from pyspec_ref import sampling as spec

UNIT = 2.0 ** -24  # float32's unit roundoff
MAX_WITHIN_ROUNDING = 0.02  # of a case's samples, plus one
LARGEST_BELOW_ONE = 1.0 - 2.0 ** -24  # the largest float32 uniform


@dataclass(frozen=True)
class SamplingCase:
    """One batch of speculative-sampling inputs (CPU tensors; the check moves them to the device)."""

    name: str
    draft_tokens: torch.Tensor  # (B, gamma) int32 or int64
    q: torch.Tensor  # (B, gamma, V) float32: probabilities, or logits when form != "probs"
    p: torch.Tensor  # (B, gamma + 1, V)
    accept_uniforms: torch.Tensor  # (B, gamma) float32
    sample_uniforms: torch.Tensor  # (B, gamma + 1) float32
    form: str = "probs"  # "probs", "logits" (softmax) or "sigmoid" (the seed paper's Eq. 5)
    strict: bool = False  # dyadic inputs: every float32 sum is exact, so nothing may differ
    tile: int | None = None  # None: the module's TILE
    alpha: float = 1.0
    beta: float = 0.0

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.q.shape)

    def on(self, device) -> tuple[torch.Tensor, ...]:
        return tuple(t.to(device) for t in (self.draft_tokens, self.q, self.p, self.accept_uniforms,
                                            self.sample_uniforms))


# --------------------------------------------------------------------------- inputs


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _probabilities(logits: torch.Tensor) -> torch.Tensor:
    """float32 probabilities of float64 softmax: normalised to within a few float32 ulps."""
    return torch.softmax(logits.double(), dim=-1).float()


def random_case(name: str, seed: int, batch: int, gamma: int, vocabulary: int, *, noise: float = 1.0,
                form: str = "probs", tile: int | None = None, token_dtype=torch.int32, boost=None,
                alpha: float = 1.0, beta: float = 0.0) -> SamplingCase:
    """Target logits ~ N(0, 2.5^2), draft logits = target + N(0, noise^2); draft tokens drawn from q.
    boost: (first token, last token + 1) whose logits get +4, to put the mass in one place."""
    g = _generator(seed)
    p_logits = 2.5 * torch.randn((batch, gamma + 1, vocabulary), generator=g, dtype=torch.float64)
    if boost is not None:
        p_logits[..., boost[0]:boost[1]] += 4.0
    q_logits = p_logits[:, :gamma] + noise * torch.randn((batch, gamma, vocabulary), generator=g,
                                                          dtype=torch.float64)
    q_probs = torch.softmax(q_logits, dim=-1)
    draft = torch.multinomial(q_probs.reshape(-1, vocabulary), 1, generator=g).reshape(batch, gamma)
    r = torch.rand((batch, gamma), generator=g)
    u = torch.rand((batch, gamma + 1), generator=g)
    if form == "probs":
        q, p = _probabilities(q_logits), _probabilities(p_logits)
    else:
        q, p = q_logits.float(), p_logits.float()
    return SamplingCase(name, draft.to(token_dtype), q, p, r, u, form=form, tile=tile, alpha=alpha, beta=beta)


def _renormalised(weights: torch.Tensor) -> torch.Tensor:
    w = weights.double()
    return (w / w.sum(dim=-1, keepdim=True)).float()


def ties_case() -> SamplingCase:
    """Dyadic distributions (multiples of 1/64) over V = 37 in tiles of 16, and uniforms placed
    exactly on thresholds: r * q(x) == p(x) (rejected: the test is strict, <) and u * total == a CDF
    boundary (the next token of positive weight is drawn: the comparison is >). Every float32
    sum here is exact, so the kernel must agree with pyspec everywhere."""
    vocabulary, gamma = 37, 2
    p_row = torch.zeros(vocabulary, dtype=torch.float64)
    q_row = torch.zeros(vocabulary, dtype=torch.float64)
    for token, sixty_fourths in ((3, 16), (20, 24), (33, 16), (36, 8)):  # tiles 0, 1, 2, 2
        p_row[token] = sixty_fourths / 64
    for token, sixty_fourths in ((3, 8), (5, 8), (20, 32), (33, 16)):
        q_row[token] = sixty_fourths / 64
    # residual max(0, p - q): 8/64 at token 3, 8/64 at token 36 (the last tile), 0 elsewhere
    batch = 5
    p = p_row.float().expand(batch, gamma + 1, vocabulary).contiguous()
    q = q_row.float().expand(batch, gamma, vocabulary).contiguous()
    # sample 2: r q(x) == p(x) at position 0 (rejected); sample 4: r = 0 and p(x) = 0 (rejected)
    draft = torch.tensor([[20, 20], [3, 33], [20, 20], [3, 20], [5, 20]], dtype=torch.int32)
    r = torch.tensor([[0.75 - 2 ** -10, 0.75 + 2 ** -10], [0.999, 0.999], [0.75, 0.0], [0.0, 0.875],
                      [0.0, 0.0]])
    u = torch.tensor([[0.0, 0.5, 0.0], [0.0, 0.0, 0.25], [0.0, 0.0, 0.0], [0.0, LARGEST_BELOW_ONE, 0.0],
                      [0.0, 0.0, 0.0]])
    return SamplingCase("ties: r * q(x) == p(x) and u * total on a CDF boundary (dyadic, V = 37, tile 16)",
                        draft, q, p, r, u.float(), strict=True, tile=16)


def resolution_case() -> SamplingCase:
    """The acceptance test at float32's resolution: p(x) = 0.3 (significand 1.2), q(x) the float32
    just above it and r = 1 - 2^-23, so r * q(x) falls short of p(x) by less than half an ulp:
    exactly (and in float64) the draft token is accepted, while the float32 product rounds up to
    p(x) and the strict test would reject it."""
    case = random_case("", 18, 3, 1, 37)
    q, p = case.q.clone(), case.p.clone()
    p_x = torch.tensor(0.3, dtype=torch.float32)
    q_x = torch.nextafter(p_x, torch.tensor(1.0))
    for b in range(q.shape[0]):
        x = int(case.draft_tokens[b, 0])
        for rows, value in ((q, q_x), (p, p_x)):
            others = rows[b, 0].double()
            others[x] = 0.0
            rows[b, 0] = (others * (1 - float(value)) / others.sum()).float()  # the row still sums to 1
            rows[b, 0, x] = value
    r = torch.full_like(case.accept_uniforms, 1 - 2 ** -23)
    return replace(case, name="acceptance at float32 resolution: r * q(x) < p(x) by less than half an ulp",
                 q=q, p=p, accept_uniforms=r)


def edge_cases(seed: int) -> list[SamplingCase]:
    """The fixed cases every check runs (the course's list), then fresh random ones, each drawn from its
    own seed, `inputs.case_seed(seed, its name)`."""
    cases = [random_case("gamma = 1", 11, 3, 1, 37)]
    base = random_case("", 12, 3, 3, 37)
    cases.append(replace(base, name="all accepted (r = 0): the bonus token from p_gamma",
                         accept_uniforms=torch.zeros_like(base.accept_uniforms)))
    # p(x_0) = 0 for every sample: r * q(x_0) > 0 = p(x_0) rejects at position 0.
    p = base.p.clone()
    for b in range(p.shape[0]):
        p[b, 0, base.draft_tokens[b, 0]] = 0.0
    r = base.accept_uniforms.clone()
    r[:, 0] = 0.5
    cases.append(replace(base, name="first rejected: p(x) = 0 at position 0", p=_renormalised(p),
                         accept_uniforms=r))
    # q(x) = 0 at every draft token: r * 0 < p(x) accepts, except in sample 0, where p(x) = 0 too
    # (0 < 0 is false: the target forbids the token, whatever r).
    q, p = base.q.clone(), base.p.clone()
    for b in range(q.shape[0]):
        for c in range(q.shape[1]):
            q[b, c, base.draft_tokens[b, c]] = 0.0
    p[0, 0, base.draft_tokens[0, 0]] = 0.0
    cases.append(replace(base, name="q(x) = 0 for the draft tokens (and p(x) = 0 in sample 0)",
                         q=_renormalised(q), p=_renormalised(p), accept_uniforms=torch.full_like(r, 0.999)))
    p = base.p.clone()
    p[:, :-1] = base.q
    cases.append(replace(base, name="p = q: every draft token accepted", p=p))
    # p = 0.9996 q: no entry of p - q is positive, so a rejection draws from p itself.
    p = base.p.clone()
    p[:, :-1] = base.q * (1 - 4e-4)
    r = torch.full_like(base.accept_uniforms, 0.99995)
    cases.append(replace(base, name="empty residual (p <= q everywhere): the draw comes from p", p=p,
                         accept_uniforms=r))
    cases.append(ties_case())
    cases.append(resolution_case())
    cases.append(random_case("V = 37 in tiles of 16, mass in the ragged last tile", 13, 3, 2, 37, tile=16,
                             boost=(32, 37)))
    last = random_case("u = 1 - 2^-24: draws at the top of the CDF", 14, 3, 2, 37)
    top = torch.full_like(last.sample_uniforms, LARGEST_BELOW_ONE)
    cases.append(replace(last, name=last.name, sample_uniforms=top))
    cases.append(random_case("int64 draft tokens", 15, 2, 2, 37, token_dtype=torch.int64))
    cases.append(random_case("from logits", 16, 3, 3, 37, form="logits"))
    same = random_case("", 17, 3, 2, 37, form="logits")
    p = same.p.clone()
    p[:, :-1] = same.q
    cases.append(replace(same, name="from logits, p = q (the same logits)", p=p))
    size = runtime.pick(sim=(4, 3, 100), gpu=(8, 5, 32000))  # pyspec_ref sums 32000 fractions per draw
    from_probs = f"random B={size[0]} gamma={size[1]} V={size[2]}"
    cases.append(random_case(from_probs, inputs.case_seed(seed, from_probs), *size))
    from_logits = f"random from logits B={size[0]} gamma={size[1]} V={size[2]}"
    cases.append(random_case(from_logits, inputs.case_seed(seed, from_logits), *size, form="logits",
                             noise=0.5))
    return cases


# --------------------------------------------------------------------------- references


def weights64(case: SamplingCase) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, p) as float64 weights: probabilities as given, softmax of logits, or the sigmoid."""
    if case.form == "probs":
        return case.q.double(), case.p.double()
    if case.form == "logits":
        return torch.softmax(case.q.double(), -1), torch.softmax(case.p.double(), -1)
    return (torch.sigmoid(case.alpha * case.q.double() + case.beta),
            torch.sigmoid(case.alpha * case.p.double() + case.beta))


def reference(case: SamplingCase) -> tuple[list[int], list[list[int]]]:
    """(accepted, emitted) of pyspec_ref (on the float64 softmax from logits); for the sigmoid, whose
    weights are no distributions, the float64 PyTorch reference (tested against pyspec_ref)."""
    if case.form == "sigmoid":

        accepted, emitted = sampling_oracle.speculative_sampling(*case.on("cpu"), form="sigmoid",
                                                                 alpha=case.alpha, beta=case.beta,
                                                                 dtype=torch.float64)
        return accepted.tolist(), emitted.tolist()
    q, p = weights64(case)
    return spec.speculative_sampling_batch(case.draft_tokens.tolist(), q.tolist(), p.tolist(),
                                           case.accept_uniforms.tolist(), case.sample_uniforms.tolist())


def summation_depth(vocabulary: int, tile: int | None) -> int:
    """How many float32 additions can lie on the path to one of the kernel's cumulative sums (the
    first-order error of a sum is at most that many units of roundoff times the sum of |terms|):
    a tile's sum or running sum (at most `tile` terms in sequence, whatever the reduction tree),
    the prefix over the T = ceil(V / tile) partial sums, and a few more (the offset, the total,
    u * total). tile None: one tile of V."""
    tile = vocabulary if tile is None else min(tile, vocabulary)
    return tile + math.ceil(vocabulary / tile) + 4


def _relative_error(case: SamplingCase, b: int, c: int, depth: int) -> float:
    """A bound on the relative float32 error of one weight of row c of sample b."""
    if case.form == "probs":
        return UNIT  # p - q, rounded once
    rows = [case.p[b, c].double()] + ([case.q[b, c].double()] if c < case.q.shape[1] else [])
    if case.form == "logits":  # exp(z - m) / l: |z - m| ulps from the argument, l's sum, a few more
        spread = max(float(row.max() - row.min()) for row in rows)
        return 2 * UNIT * (spread + depth + 8)
    spread = max(float((case.alpha * row + case.beta).abs().max()) for row in rows)
    return 2 * UNIT * (spread + 8)


@dataclass
class Tally:
    """How the kernel's samples compare with the reference."""

    exact: int = 0
    within_rounding: int = 0
    wrong: list[str] = field(default_factory=list)  # one line per wrong sample
    too_many: str = ""  # set when more samples are within rounding than chance explains

    @property
    def samples(self) -> int:
        return self.exact + self.within_rounding + len(self.wrong)

    @property
    def problems(self) -> list[str]:
        return self.wrong + ([self.too_many] if self.too_many else [])

    def __str__(self) -> str:
        text = (f"{self.exact} samples exact, {self.within_rounding} within float32 rounding, "
                f"{len(self.wrong)} wrong")
        return text + (f" ({self.too_many})" if self.too_many else "")


def _draw_within_rounding(case, b, c, got, want, q64, p64, depth) -> str:
    """'' if drawing `got` where the reference drew `want` is explained by float32 rounding, else why not."""
    vocabulary = q64.shape[-1]
    if not 0 <= got < vocabulary:
        return f"drew {got}, not a token id in [0, {vocabulary})"
    delta = _relative_error(case, b, c, depth)
    p_row = p64[b, c]
    q_row = q64[b, c] if c < q64.shape[1] else torch.zeros_like(p_row)
    residual = (p_row - q_row).clamp(min=0)
    noise = delta * float(p_row.sum() + q_row.sum())  # the weights' own rounding, summed
    candidates = [residual] if bool((residual > 0).any()) else []
    if not candidates or float(residual.sum()) <= 2 * noise:  # empty, or empty within rounding: p's branch
        candidates.append(p_row)
    u = float(case.sample_uniforms[b, c])
    closest = math.inf
    for w in candidates:
        if float(w[got]) <= 0 and not (case.form != "probs" and float(p_row[got] - q_row[got]) >= -noise):
            continue  # a token of weight 0 is never drawn
        total = float(w.sum())
        bound = 2 * (noise + depth * UNIT * total)
        cdf = torch.cumsum(w, 0)
        threshold = u * total
        # Drawing an earlier token means its boundary seemed above u * total, a later one that the
        # boundary before it seemed below: either way, how far that boundary really is.
        distance = threshold - float(cdf[got]) if got < want else float(cdf[got - 1]) - threshold
        closest = min(closest, distance)
        if distance <= bound:
            return ""
    return (f"drew token {got} where pyspec_ref draws {want} (u = {u:.9g}); the CDF boundary between them is "
            f"{closest:.3g} from u * total, beyond float32 rounding")


def classify(case: SamplingCase, accepted: torch.Tensor, emitted: torch.Tensor,
             tile: int | None = None) -> Tally:
    """Compare a kernel's (accepted, emitted) with `reference(case)`, sample by sample. tile: the
    vocabulary tile the kernel summed by (case.tile if the case sets one; None: a single sum over V,
    the loosest bound)."""
    depth = summation_depth(case.q.shape[2], case.tile or tile)
    want_accepted, want_emitted = reference(case)
    got_accepted, got_emitted = accepted.cpu().tolist(), emitted.cpu().tolist()
    q64, p64 = weights64(case)
    tally = Tally()
    for b, (a, a_ref) in enumerate(zip(got_accepted, want_accepted, strict=True)):
        row, row_ref = got_emitted[b], want_emitted[b]
        if a != a_ref:
            c = min(a, a_ref)
            x = int(case.draft_tokens[b, c])
            r = float(case.accept_uniforms[b, c])
            left, right = r * float(q64[b, c, x]), float(p64[b, c, x])
            margin = abs(left - right)
            tolerance = 2 * _relative_error(case, b, c, depth) * (left + right)
            test = f"r * q(x) = {left:.9g} vs p(x) = {right:.9g} at position {c}, token {x}"
            if case.form == "probs" or case.strict or margin > tolerance:
                how = "bit-exact acceptance is required from probabilities" if case.form == "probs" else \
                    f"{margin:.3g} apart, beyond float32 rounding {tolerance:.3g}"
                tally.wrong.append(f"sample {b}: accepted = {a}, pyspec_ref accepts {a_ref} ({test}: {how})")
            else:
                tally.within_rounding += 1
            continue
        if row[:a] != row_ref[:a] or row[a + 1:] != row_ref[a + 1:]:
            tally.wrong.append(f"sample {b}: emitted = {row}, expected {row_ref} (accepted draft tokens, "
                               f"then one drawn token, then {spec.PAD})")
            continue
        if row[a] == row_ref[a]:
            tally.exact += 1
            continue
        why = (f"drew token {row[a]} where pyspec_ref draws {row_ref[a]} (u = "
               f"{float(case.sample_uniforms[b, a]):.9g}): dyadic inputs, every sum exact, so no rounding "
               "explains it" if case.strict
               else _draw_within_rounding(case, b, a, row[a], row_ref[a], q64, p64, depth))
        if why:
            tally.wrong.append(f"sample {b}, position {a}: {why}")
        else:
            tally.within_rounding += 1
    allowed = 0 if case.strict else int(MAX_WITHIN_ROUNDING * tally.samples) + 1
    if tally.within_rounding > allowed:
        tally.too_many = (f"{tally.within_rounding} samples within float32 rounding of a threshold, more "
                          f"than the {allowed} that chance explains")
    return tally


# --------------------------------------------------------------------------- the checks


def _summary(wrong: list[str], limit: int = 3) -> str:
    more = f"\n... and {len(wrong) - limit} more" if len(wrong) > limit else ""
    return "\n".join(wrong[:limit]) + more


def run_case(sampler, case: SamplingCase, device=None, tile: int | None = None) -> tuple[Tally, str]:
    """Run `sampler(draft_tokens, q, p, accept_uniforms, sample_uniforms)` twice on a case: (the
    comparison with the reference (`classify`), a rerun problem or '')."""
    arguments = case.on(device or runtime.torch_device())
    first = sampler(*arguments)
    second = sampler(*arguments)
    return classify(case, *first, tile=tile), rerun_problem(tuple(first), tuple(second))


class TilePassStandIn:
    """The per-tile pass in PyTorch, launched as the kernel is (`stand_in[grid](...)`, the same
    arguments): acceptance tests in float64 of the float32 weights, and each tile's float32 sums of
    max(0, p - q) and of p. The check of the draw runs on it while the student's tile_pass_kernel is
    still a stub, so that the two exercises of notebook 15 are checked independently."""

    def __getitem__(self, grid):
        return self.run

    @staticmethod
    def _weights(logits_or_probs, max_tiles, sum_tiles, alpha, beta, form):
        """(rows, V) float32 weights, as `load_weights` computes them (form 0, 1, 2 as in FORMS)."""
        z = logits_or_probs.float()
        if form == 0:
            return z
        if form == 2:
            return torch.sigmoid(alpha * z + beta)
        m = max_tiles.max(dim=-1, keepdim=True).values  # the row's statistics from the tiles' pairs
        l = (sum_tiles * torch.exp(max_tiles - m)).sum(dim=-1, keepdim=True)
        return torch.exp(z - m) / l

    def run(self, X, P, Q, R, accept, residual_sums, target_sums, p_max, p_sum, q_max, q_sum, V, T, GAMMA,
            alpha, beta, *, FORM, TILE, TILES_BLOCK, num_warps=None):
        batch = X.shape[0]
        rows = (batch, GAMMA + 1, T)
        p = self._weights(P.reshape(batch, GAMMA + 1, V), p_max.view(rows), p_sum.view(rows), alpha, beta,
                          FORM)
        q = torch.zeros_like(p)
        q[:, :GAMMA] = self._weights(Q.reshape(batch, GAMMA, V), q_max.view(rows)[:, :GAMMA],
                                     q_sum.view(rows)[:, :GAMMA], alpha, beta, FORM)
        padded = T * TILE - V  # the ragged last tile, padded with zero weights
        by_tiles = [torch.nn.functional.pad(w, (0, padded)).view(batch, GAMMA + 1, T, TILE) for w in (p, q)]
        residual_sums.view(rows).copy_(torch.clamp(by_tiles[0] - by_tiles[1], min=0.0).sum(dim=-1))
        target_sums.view(rows).copy_(by_tiles[0].sum(dim=-1))
        tokens = X.long().unsqueeze(-1)
        p_x = p[:, :GAMMA].gather(-1, tokens).squeeze(-1).double()
        q_x = q[:, :GAMMA].gather(-1, tokens).squeeze(-1).double()
        accepted = R.view(batch, GAMMA).double() * q_x < p_x  # strict, as the specification
        accept.view(batch, GAMMA).copy_(accepted.to(torch.int8))


def _tile_pass_of(module):
    """A context in which `module` runs the stand-in tile pass if its own is still a stub."""
    from unittest import mock

    from course.core.stubs import kernel_stub_name

    if kernel_stub_name(module.tile_pass_kernel) is None:
        return contextlib.nullcontext()
    return mock.patch.object(module, "tile_pass_kernel", TilePassStandIn())


def check_spec_sampling(module, seed: int):
    """module.speculative_sampling must emit pyspec_ref's tokens (within float32 rounding of a draw's
    threshold, counted and bounded; bit-exact acceptance from probabilities). While the module's
    tile_pass_kernel is a stub, the draw runs on `TilePassStandIn`."""
    for case in edge_cases(seed):
        def run(case=case):
            def sampler(*arguments):
                with _tile_pass_of(module):
                    return module.speculative_sampling(*arguments, from_logits=case.form == "logits",
                                                       tile=case.tile)

            tally, race = run_case(sampler, case, tile=module.TILE)
            problem = _summary(tally.problems) or race
            return CaseResult(case.name, not problem, problem or str(tally))
        yield case.name, run


def tile_sums64(case: SamplingCase, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual_sums, target_sums) (B, gamma + 1, T) in float64: per tile, the sums of max(0, p - q)
    (of p at the bonus position) and of p."""
    q64, p64 = weights64(case)
    batch, gamma, vocabulary = q64.shape
    tiles = math.ceil(vocabulary / tile)
    q_full = torch.cat([q64, torch.zeros((batch, 1, vocabulary), dtype=torch.float64)], dim=1)
    padding = tiles * tile - vocabulary
    residual = torch.nn.functional.pad((p64 - q_full).clamp(min=0), (0, padding))
    target = torch.nn.functional.pad(p64, (0, padding))
    shape = (batch, gamma + 1, tiles, tile)
    return residual.view(shape).sum(-1), target.view(shape).sum(-1)


def check_tile_pass(module, seed: int):
    """module.tile_pass: the acceptance tests (pyspec_ref.sampling.accepts, bit for bit from
    probabilities) and each tile's partial sums of max(0, p - q) and of p (float64 reference)."""
    labels = ("batch", "position", "tile")
    for case in edge_cases(seed):
        def run(case=case):
            arguments = case.on(runtime.torch_device())[:4]
            from_logits = case.form == "logits"
            accept, residual_sums, target_sums = module.tile_pass(*arguments, from_logits=from_logits,
                                                                  tile=case.tile)
            again = module.tile_pass(*arguments, from_logits=from_logits, tile=case.tile)
            q64, p64 = weights64(case)
            problems = []
            for b in range(q64.shape[0]):
                for c in range(q64.shape[1]):
                    x, r = int(case.draft_tokens[b, c]), float(case.accept_uniforms[b, c])
                    want = spec.accepts(r, float(p64[b, c, x]), float(q64[b, c, x]))
                    if bool(accept[b, c]) == want:
                        continue
                    left, right = r * float(q64[b, c, x]), float(p64[b, c, x])
                    depth = summation_depth(q64.shape[2], case.tile or module.TILE)
                    tolerance = 2 * _relative_error(case, b, c, depth) * (left + right)
                    if case.form == "probs" or abs(left - right) > tolerance:
                        problems.append(f"batch {b}, position {c}: accept = {bool(accept[b, c])}, expected "
                                        f"{want} (r * q(x) = {left:.9g}, p(x) = {right:.9g}, token {x})")
            tile = case.tile or module.TILE
            want_residual, want_target = tile_sums64(case, tile)
            atol, rtol = (1e-7, 2e-5) if case.form == "probs" else (5e-5, 1e-4)
            problem = (_summary(problems)
                       or compare_floats(residual_sums, want_residual, "residual_sums", labels, atol, rtol)
                       or compare_floats(target_sums, want_target, "target_sums", labels, atol, rtol)
                       or rerun_problem((accept, residual_sums, target_sums), again))
            return CaseResult(case.name, False, problem) if problem else None
        yield case.name, run


# --------------------------------------------------------------------------- notebook 21: sibling draws

# (name, nodes, V, k, logit scale, one token boosted by): spread and peaked rows (a low temperature
# puts nearly all of q on one token, where drawing with replacement would repeat it), k = 1 (a chain)
# and k = V (every token), a vocabulary wider than one power of two.
SIBLING_CASES = (("spread, V=7, k=3", 4, 7, 3, 1.0, 0.0), ("peaked, V=80, k=4", 6, 80, 4, 2.0, 12.0),
                 ("one child, V=80, k=1", 3, 80, 1, 2.0, 0.0), ("every token, V=6, k=6", 2, 6, 6, 1.0, 0.0),
                 ("V=200, k=5", 2, 200, 5, 3.0, 0.0))
KEY_TIE = 1e-12  # two Gumbel keys this close may order either way in float64


def sibling_inputs(nodes: int, vocab: int, scale: float, boost: float, seed: int):
    gen = _generator(seed)
    logits = torch.randn((nodes, vocab), generator=gen) * scale
    logits[:, int(torch.randint(0, vocab, (1,), generator=gen))] += boost
    uniforms = torch.rand((nodes, vocab), generator=gen, dtype=torch.float64)
    return logits, uniforms


def _keys(q: list[float], u: list[float]) -> list[float]:
    return [math.log(w) - math.log(-math.log(x)) if w > 0 and x > 0 else -math.inf
            for w, x in zip(q, u, strict=True)]


def _sibling_problem(node: int, got: list[int], got_logq: list[float], q: list[float],
                     u: list[float], k: int) -> str:
    """Where node `node`'s siblings differ from `spec.gumbel_top_k`, and the likely cause."""
    from course.core.launch import never_written

    want = spec.gumbel_top_k(q, k, u)
    keys = _keys(q, u)
    where = f"node {node}: siblings {got}, expected {want}"
    if never_written(torch.int64) in got:
        return f"{where}\n  sibling {got.index(never_written(torch.int64))} was never written"
    if any(not 0 <= t < len(q) for t in got):
        return f"{where}\n  a token outside the vocabulary [0, {len(q)})"
    if len(set(got)) < len(got):
        twice = next(t for t in got if got.count(t) > 1)
        return (f"{where}\n  token {twice} drawn twice: without replacement, a drawn token must leave the "
                "keys before the next draw")
    if got != want:
        if all(abs(keys[a] - keys[b]) < KEY_TIE for a, b in zip(got, want, strict=True)):
            return ""
        if sorted(got) == sorted(want):
            return f"{where}\n  the right tokens in the wrong order: siblings come in decreasing key"
        likely = sorted(range(len(q)), key=lambda v: (-q[v], v))[:k]
        if got == likely:
            return (f"{where}\n  these are the {k} most likely tokens: the Gumbel noise -log(-log u) is "
                    "missing")
        return f"{where}\n  the keys must be log q(v) - log(-log u_v), one uniform per token v"
    bad = [(i, g, math.log(q[t])) for i, (t, g) in enumerate(zip(got, got_logq, strict=True))
           if not abs(g - math.log(q[t])) <= 1e-9]
    if bad:
        i, g, w = bad[0]
        return (f"node {node}, sibling {i} (token {got[i]}): log q = {g!r}, expected {w:.12g}: the row's "
                "log-softmax at the drawn token")
    return ""


def _sibling_case(module, nodes, vocab, k, scale, boost, seed) -> str:
    logits, uniforms = sibling_inputs(nodes, vocab, scale, boost, seed)
    device = runtime.torch_device()
    tokens, logq = module.draw_siblings(logits.to(device), uniforms.to(device), k)
    again = module.draw_siblings(logits.to(device), uniforms.to(device), k)
    q = torch.softmax(logits.double(), dim=-1)
    for node in range(nodes):
        problem = _sibling_problem(node, tokens[node].tolist(), logq[node].tolist(), q[node].tolist(),
                                   uniforms[node].tolist(), k)
        if problem:
            return problem
    return rerun_problem((tokens, logq), again)


def _sibling_refusal(module, change: str, name: str) -> str:
    """A bad argument must raise ValueError naming it, leaving the caller's tensors as they were."""
    logits, uniforms = sibling_inputs(2, 9, 1.0, 0.0, 5)
    k = 3
    if change == "NaN logits":
        logits[1, 4] = float("nan")
    elif change == "uniforms of another shape":
        uniforms = uniforms[:, :5]
    elif change == "k above V":
        k = 10
    before = (logits.clone(), uniforms.clone())
    device = runtime.torch_device()
    logits_d, uniforms_d = logits.to(device), uniforms.to(device)
    try:
        module.draw_siblings(logits_d, uniforms_d, k)
    except ValueError as error:
        if name not in str(error):
            return f"the ValueError does not name {name!r}: {error}"
        same = torch.equal(logits_d.cpu().nan_to_num(), before[0].nan_to_num()) and torch.equal(
            uniforms_d.cpu(), before[1])
        return "" if same else "the call was refused, but changed its inputs"
    return f"{change} was accepted"


def check_sibling_draw(module, seed: int):
    """module.draw_siblings must draw each node's k siblings as `pyspec_ref.sampling.gumbel_top_k`
    does on the same uniforms (tokens exactly, log q to 1e-9), and refuse bad input by name."""
    for name, nodes, vocab, k, scale, boost in SIBLING_CASES:
        label = f"{name}, {nodes} nodes"

        def run(nodes=nodes, vocab=vocab, k=k, scale=scale, boost=boost, label=label):
            problem = _sibling_case(module, nodes, vocab, k, scale, boost, inputs.case_seed(seed, label))
            return CaseResult(label, False, problem) if problem else None
        yield label, run
    for change, name in (("NaN logits", "logits"), ("uniforms of another shape", "uniforms"),
                         ("k above V", "k")):
        label = f"{change} -> ValueError naming {name}"

        def refuse(change=change, name=name, label=label):
            problem = _sibling_refusal(module, change, name)
            return CaseResult(label, False, problem) if problem else None
        yield label, refuse
