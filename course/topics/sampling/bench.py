"""Speculative sampling's measurements (notebook 15): `python -m course bench sampling [sections]` on a GPU.

Writes results/<device>/sampling.json in the shared results schema. Rows of section "timing"
time one implementation at one size with `course.measure.timing.bench` on random inputs, all in the same
run:
  baseline_torch   `course.oracle.sampling.speculative_sampling` in float32: the multi-kernel
                   PyTorch version (softmax, gather, test, cumulative test, residual, sampling;
                   input "logits" or "probs")
  exact_probs      `solutions.spec_sampling`, the seed paper's tiled kernel, from probabilities
  exact_logits     the same kernel with the softmax fused, from logits
  sigmoid_logits   the seed paper's sigmoid approximation (its Eq. 5), fused on logits
  read_once_floor  not run: modelled as the bytes of q and p (read once, float32) divided by the
                   copy bandwidth measured in the same run (`copy_bandwidth`)
Sizes: B in BATCHES, gamma in GAMMAS, V in VOCABULARIES. The row schema's sizes are mapped as
B = B, H = 1, N = gamma, d = V; every row also has the fields "gamma", "V" and "input". Kernel
rows time the kernels alone (`prepare_sampling`: the input checks run once, outside the timing).
max_abs_err of a timing row is the fraction of the B samples whose (accepted, emitted) differ
from the float64 reference of the same algorithm on the same inputs
(`course.oracle.sampling.speculative_sampling` in float64): 0 unless a draw falls within float32
rounding of a CDF boundary. Sigmoid rows also have "differs_from_exact", the fraction that differ
from the exact algorithm's reference.

Rows of section "graphs" time the same implementations at the headline size (gamma = 5,
V = 128256, every B) replayed as CUDA graphs (`course.measure.timing.graphed`): one launch for all of an
implementation's kernels, as a decoder that captures its step runs them. At B = 1 the eager
timings are mostly launch overhead; these rows say what the kernels themselves cost.

Rows of section "quality" (name sigmoid_logits) measure the approximation itself on synthetic
draft/target logit pairs with a controlled mismatch (`sigmoid_quality`, exact float64 formulas,
no sampling noise): acceptance rates of the exact and the approximate test, and the distance of
the first emitted token's distribution from the target p (total variation, and as max_abs_err
the largest |P(i) - p(i)|); their median_ms is the sigmoid kernel's time on those logits.

"""

from __future__ import annotations

import math

import torch

from course.core import runtime
from course.core.impl import bench_impl, load
from course.measure import results, timing
from course.oracle import sampling as sampling_oracle

SUITE = "sampling"
BATCHES = (1, 8, 64)
GAMMAS = (1, 5, 10)
VOCABULARIES = (32000, 128256, 152064)
HEADLINE = dict(gamma=5, V=128256)  # the size of the course's headline baseline and targets
SEED = 2024
LOGIT_SCALE = 3.0  # target logits ~ N(0, 3^2): a few tokens hold most of the mass
DRAFT_NOISE = 1.0  # draft logits = target logits + N(0, 1): acceptance around one half
MISMATCHES = (0.0, 0.25, 0.5, 1.0, 2.0)  # draft noise levels of the quality rows
IMPLEMENTATIONS = ("baseline_torch", "exact_probs", "exact_logits", "sigmoid_logits", "read_once_floor")


# --------------------------------------------------------------------------- the PyTorch version


def baseline_torch(draft_tokens, q, p, accept_uniforms, sample_uniforms, *, from_logits: bool = False):
    """Implementation (a): `course.oracle.sampling.speculative_sampling` in float32."""
    return sampling_oracle.speculative_sampling(draft_tokens, q, p, accept_uniforms, sample_uniforms,
                                      form="logits" if from_logits else "probs")


# --------------------------------------------------------------------------- inputs and bytes


def synthetic_logits(batch: int, gamma: int, vocabulary: int, *, noise: float = DRAFT_NOISE,
                     scale: float = LOGIT_SCALE, seed: int = SEED, device=None):
    """(q_logits (B, gamma, V), p_logits (B, gamma + 1, V)) float32: target logits ~ N(0, scale^2),
    draft logits = target logits + N(0, noise^2) (noise 0: the same model)."""
    device = device or runtime.torch_device()
    generator = torch.Generator(device=device).manual_seed(seed)
    p_logits = scale * torch.randn((batch, gamma + 1, vocabulary), generator=generator, device=device)
    q_logits = p_logits[:, :gamma] + noise * torch.randn((batch, gamma, vocabulary), generator=generator,
                                                         device=device)
    return q_logits.contiguous(), p_logits


def draft_and_uniforms(q_logits: torch.Tensor, seed: int = SEED):
    """Draft tokens drawn from softmax(q_logits) (as the draft model samples them), int64, and the
    uniforms (B, gamma), (B, gamma + 1) float32."""
    batch, gamma, vocabulary = q_logits.shape
    generator = torch.Generator(device=q_logits.device).manual_seed(seed + 1)
    q = torch.softmax(q_logits.double(), dim=-1).reshape(-1, vocabulary)
    draft = torch.multinomial(q, 1, generator=generator).reshape(batch, gamma)
    accept_uniforms = torch.rand((batch, gamma), generator=generator, device=q_logits.device)
    sample_uniforms = torch.rand((batch, gamma + 1), generator=generator, device=q_logits.device)
    return draft, accept_uniforms, sample_uniforms


def read_once_bytes(batch: int, gamma: int, vocabulary: int, itemsize: int = 4) -> int:
    """Bytes of q (B, gamma, V) and p (B, gamma + 1, V): what any exact sampler must read once."""
    return batch * (2 * gamma + 1) * vocabulary * itemsize


def baseline_bytes(batch: int, gamma: int, vocabulary: int, from_logits: bool, itemsize: int = 4) -> dict:
    """Bytes that `course.oracle.sampling.speculative_sampling` moves, step by step (reads + writes),
    at one size: the model behind notebook 15's comparison. Steps on one row per sample (B x V) are counted
    as their operations read and write them; gathers of B x gamma numbers are left out."""
    full = batch * (2 * gamma + 1) * vocabulary * itemsize  # q and p once
    row = batch * vocabulary * itemsize
    steps = {}
    if from_logits:
        steps["softmax(q), softmax(p): read logits, write probabilities"] = 2 * full
    steps["gather p(x), q(x); the test; cumulative test"] = 0
    steps["p and q rows of the first rejection: read, write"] = 4 * row
    steps["residual max(0, p - q): read 2 rows, write 1"] = 3 * row
    steps["empty residual? any(residual > 0): read"] = row
    steps["where(empty, p, residual): read 2, write 1"] = 3 * row
    steps["cumsum: read, write"] = 2 * row
    return steps


def copy_bandwidth(megabytes: int = 1024) -> float:
    """Bytes per second of a device-to-device copy (read + write), measured now on the GPU."""
    count = megabytes * (1 << 20) // 4
    source = torch.rand(count, device=runtime.torch_device())
    target = torch.empty_like(source)
    ms = timing.bench(lambda: target.copy_(source), rep_ms=200)
    return 2 * count * 4 / (ms * 1e-3)


# --------------------------------------------------------------------------- the sigmoid's quality


def first_token_distribution(q_logits: torch.Tensor, p_logits: torch.Tensor, form: str, alpha: float = 1.0,
                             beta: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(acceptance rate (N,), distribution of the first emitted token (N, V)), exactly, in float64,
    for rows (N, V) of draft and target logits, when the draft token is drawn from q = softmax(q_logits)
    and the test and the residual use the weights of `form` ("logits": exact; "sigmoid": Eq. 5):

        P(i) = q(i) * min(1, p~(i) / q~(i)) + (1 - sum_j q(j) min(1, p~(j) / q~(j))) * R(i),

    R = max(0, p~ - q~) normalised (p~ normalised if that is empty). For "logits" P = p exactly
    (the theorem of speculative sampling); for "sigmoid" P is what the approximation emits."""
    q = torch.softmax(q_logits.double(), dim=-1)
    q_w = sampling_oracle.weights_of(q_logits.double(), form, alpha, beta)
    p_w = sampling_oracle.weights_of(p_logits.double(), form, alpha, beta)
    ratio = torch.where(q_w > 0, p_w / q_w.clamp(min=1e-300), torch.ones_like(q_w)).clamp(max=1.0)
    keep = q * ratio
    acceptance = keep.sum(dim=-1)
    residual = (p_w - q_w).clamp(min=0)
    empty = ~(residual > 0).any(dim=-1, keepdim=True)
    residual = torch.where(empty, p_w, residual)
    residual = residual / residual.sum(dim=-1, keepdim=True)
    return acceptance, keep + (1 - acceptance).unsqueeze(-1) * residual


def calibrated_beta(p_logits: torch.Tensor, alpha: float = 1.0) -> float:
    """One constant beta for a workload: minus the mean log-partition log sum_i exp(alpha z_i) of its
    target rows, so that sigmoid(alpha z + beta) ~ exp(alpha z + beta) ~ softmax for small weights."""
    return -float(torch.logsumexp(alpha * p_logits.double(), dim=-1).mean())


def sigmoid_quality(mismatches=MISMATCHES, rows: int = 64, vocabulary: int = 32000, alpha: float = 1.0,
                    beta: float | None = None, scale: float = LOGIT_SCALE, seed: int = SEED,
                    device=None) -> list[dict]:
    """The approximation's deviation on synthetic pairs: for each draft noise level (the mismatch),
    `rows` target rows of logits ~ N(0, scale^2) and draft rows = target + N(0, mismatch^2).
    beta None: `calibrated_beta` of the target rows (one constant for all levels). Returns one dict
    per level: mismatch, tv_pq (the distance between p and q), beta, acceptance_exact,
    acceptance_sigmoid, tv_distance and max_abs_err of the first emitted token's distribution vs p
    (means over the rows). Exact float64 formulas (`first_token_distribution`): no sampling noise."""
    device = device or torch.device("cpu")
    out = []
    for mismatch in mismatches:
        q_logits, p_logits = synthetic_logits(rows, 1, vocabulary, noise=mismatch, scale=scale, seed=seed,
                                              device=device)
        q_logits, p_logits = q_logits[:, 0], p_logits[:, 0]
        b = calibrated_beta(p_logits, alpha) if beta is None else beta
        p = torch.softmax(p_logits.double(), dim=-1)
        q = torch.softmax(q_logits.double(), dim=-1)
        exact_rate, _ = first_token_distribution(q_logits, p_logits, "logits")
        rate, emitted = first_token_distribution(q_logits, p_logits, "sigmoid", alpha, b)
        out.append({"mismatch": mismatch, "tv_pq": float(0.5 * (p - q).abs().sum(-1).mean()), "alpha": alpha,
                    "beta": b, "acceptance_exact": float(exact_rate.mean()),
                    "acceptance_sigmoid": float(rate.mean()),
                    "tv_distance": float(0.5 * (emitted - p).abs().sum(-1).mean()),
                    "max_abs_err": float((emitted - p).abs().max(-1).values.mean())})
    return out


# --------------------------------------------------------------------------- measurements (GPU)


def _differs(got, want) -> float:
    """Fraction of samples whose (accepted, emitted) differ."""
    (a, e), (a_ref, e_ref) = got, want
    bad = (a.long() != a_ref.long()) | (e.long() != e_ref.long()).any(dim=1)
    return float(bad.double().mean())


def _row(name, batch, gamma, vocabulary, source, median_ms, err, **extra) -> dict:
    row = {"name": name, "section": "timing", "input": source, "B": batch, "H": 1, "N": gamma,
           "d": vocabulary, "gamma": gamma, "V": vocabulary, "median_ms": float(median_ms),
           "max_abs_err": float(err)}
    row.update(extra)
    print(f"{name:16} {source:6} B={batch:<3} gamma={gamma:<2} V={vocabulary:<6}: "
          f"{row['median_ms'] * 1e3:9.1f} us, differs {row['max_abs_err']:.3f}", flush=True)
    return row


def measure_size(batch: int, gamma: int, vocabulary: int, names=IMPLEMENTATIONS,
                 bandwidth: float | None = None, rep_ms: float = 100,
                 beta: float | None = None, graphs: bool = False) -> list[dict]:
    """Timing rows of the implementations `names` at one size, on the same random inputs; with
    graphs=True each one replayed as a CUDA graph (`timing.graphed`, rows of section "graphs")."""
    from course.topics.sampling.launch import prepare_sampling

    kernels = load("spec_sampling", bench_impl())
    q_logits, p_logits = synthetic_logits(batch, gamma, vocabulary, device=runtime.torch_device())
    draft, r, u = draft_and_uniforms(q_logits)
    q, p = torch.softmax(q_logits, dim=-1), torch.softmax(p_logits, dim=-1)
    beta = -math.log(vocabulary) if beta is None else beta
    inputs = {"probs": (q, p), "logits": (q_logits, p_logits)}
    references = {}

    def reference(form):
        if form not in references:
            q_in, p_in = inputs["probs" if form == "probs" else "logits"]
            references[form] = sampling_oracle.speculative_sampling(draft, q_in, p_in, r, u, form=form,
                                                                    beta=beta, dtype=torch.float64)
        return references[form]

    rows = []
    for name in names:
        sources = ("logits", "probs") if name in ("baseline_torch", "read_once_floor") else \
            ("probs",) if name == "exact_probs" else ("logits",)
        for source in sources:
            q_in, p_in = inputs[source]
            if name == "read_once_floor":
                if bandwidth is None:
                    bandwidth = copy_bandwidth()
                nbytes = read_once_bytes(batch, gamma, vocabulary)
                rows.append(_row(name, batch, gamma, vocabulary, source, nbytes / bandwidth * 1e3, 0.0,
                                 modelled=True, bytes=nbytes, bandwidth_GBps=bandwidth / 1e9))
                continue
            if name == "baseline_torch":
                def fn(q_in=q_in, p_in=p_in, source=source):
                    return baseline_torch(draft, q_in, p_in, r, u, from_logits=source == "logits")
                form = source
            else:
                form = {"exact_probs": "probs", "exact_logits": "logits", "sigmoid_logits": "sigmoid"}[name]
                fn = prepare_sampling(kernels, draft, q_in, p_in, r, u, form=form, beta=beta)
            extra = {"section": "graphs", "launch": "cuda_graph"} if graphs else {}
            if graphs:
                fn = timing.graphed(fn)
            got = tuple(t.clone() for t in fn())
            if name == "sigmoid_logits":
                extra.update(alpha=1.0, beta=beta, differs_from_exact=_differs(got, reference("logits")))
            err = _differs(got, reference(form))
            rows.append(_row(name, batch, gamma, vocabulary, source, timing.bench(fn, rep_ms=rep_ms), err,
                             **extra))
    return rows


def timing_rows(batches=BATCHES, gammas=GAMMAS, vocabularies=VOCABULARIES) -> list[dict]:
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth: {bandwidth / 1e9:.0f} GB/s", flush=True)
    rows = []
    for vocabulary in vocabularies:
        for gamma in gammas:
            for batch in batches:
                rows += measure_size(batch, gamma, vocabulary, bandwidth=bandwidth)
                torch.cuda.empty_cache()
    return rows


def graph_rows(batches=BATCHES) -> list[dict]:
    """At the headline size, every implementation replayed as a CUDA graph: at B = 1 the eager
    times are mostly the launches of a few short kernels (the baseline's tens of torch calls, the
    kernels' two or three Triton launches), which a decoder running its step as a graph does not
    pay. The read-once floor is the same model as in the timing section."""
    bandwidth = copy_bandwidth()
    names = [name for name in IMPLEMENTATIONS if name != "read_once_floor"]
    rows = []
    for batch in batches:
        rows += measure_size(batch, HEADLINE["gamma"], HEADLINE["V"], names, bandwidth=bandwidth, graphs=True)
        torch.cuda.empty_cache()
    return rows


def quality_rows(batch: int = 64, gamma: int = 5, vocabulary: int = 32000) -> list[dict]:
    """Section "quality": `sigmoid_quality` per mismatch, with the sigmoid kernel's time on those logits."""
    from course.topics.sampling.launch import prepare_sampling

    kernels = load("spec_sampling", bench_impl())
    rows = []
    for quality in sigmoid_quality(device=runtime.torch_device(), vocabulary=vocabulary):
        q_logits, p_logits = synthetic_logits(batch, gamma, vocabulary, noise=quality["mismatch"],
                                              device=runtime.torch_device())
        draft, r, u = draft_and_uniforms(q_logits)
        fn = prepare_sampling(kernels, draft, q_logits, p_logits, r, u, form="sigmoid", beta=quality["beta"])
        accepted, _ = fn()
        row = {"name": "sigmoid_logits", "section": "quality", "input": "logits", "B": batch, "H": 1,
               "N": gamma, "d": vocabulary, "gamma": gamma, "V": vocabulary,
               "median_ms": timing.bench(fn, rep_ms=50),
               "kernel_accepted_per_token": float(accepted.double().mean() / gamma)}
        row.update(quality)
        print(f"quality: mismatch {quality['mismatch']}: acceptance {quality['acceptance_exact']:.3f} exact, "
              f"{quality['acceptance_sigmoid']:.3f} sigmoid; TV {quality['tv_distance']:.4f}", flush=True)
        rows.append(row)
    return rows


SECTIONS = {"timing": timing_rows, "graphs": graph_rows, "quality": quality_rows}


def section_of(row: dict) -> str:
    """The section that measures a row of sampling.json."""
    return row.get("section", "timing")


# --------------------------------------------------------------------------- for notebook 15


def committed() -> tuple[dict | None, str]:
    """The committed sampling.json (or None) and a sentence saying where it comes from."""
    try:
        document = results.load(SUITE)
    except FileNotFoundError:
        return None, ("not measured yet: no committed results/<device>/sampling.json; run "
                      "`python -m course bench sampling` on a GPU")
    return document, f"committed measurements from {document['device']} ({document['date'][:10]})"


def runtimes(batch: int, gamma: int = HEADLINE["gamma"], vocabulary: int = HEADLINE["V"],
             names=IMPLEMENTATIONS) -> tuple[list[dict], str]:
    """Timing rows of `names` at one size, and where they come from: measured now on a GPU; in the
    simulator the committed rows of sampling.json, or [] and "not measured yet"."""
    unknown = [name for name in names if name not in IMPLEMENTATIONS]
    if unknown:
        raise ValueError(f"names must be some of {IMPLEMENTATIONS}, got {unknown}")
    if runtime.on_gpu():
        return measure_size(batch, gamma, vocabulary, names), f"measured now on {runtime.device_name()}"
    document, source = committed()
    if document is None:
        return [], source
    rows = [row for row in document["rows"] if row.get("section") == "timing" and row["name"] in names
            and row["B"] == batch and row["gamma"] == gamma and row["V"] == vocabulary]
    return rows, f"simulator: {source}, not timings of this machine"


def find(rows, name: str, source: str, section: str = "timing", **at) -> dict | None:
    """The row of `name` with input `source` in `section` ("timing": launched eagerly; "graphs":
    replayed as a CUDA graph) at the sizes `at` (B=..., gamma=..., V=...), or None."""
    found = [row for row in rows if row["name"] == name and row.get("input") == source
             and row.get("section", "timing") == section and all(row.get(k) == v for k, v in at.items())]
    return found[0] if found else None


def targets(rows) -> list[dict]:
    """The course's targets computed from timing rows: one dict per target and input (name, value,
    goal, met), value None where a row is missing."""
    gamma, vocabulary = HEADLINE["gamma"], HEADLINE["V"]
    out = []

    def ms(name, source, batch, section="timing"):
        row = find(rows, name, source, section, B=batch, gamma=gamma, V=vocabulary)
        return row["median_ms"] if row else None

    def add(text, value, goal, at_least):
        met = None if value is None else (value >= goal if at_least else value <= goal)
        out.append({"target": text, "value": value, "goal": goal, "met": met})

    for source, exact in (("logits", "exact_logits"), ("probs", "exact_probs")):
        base, fast = ms("baseline_torch", source, 1), ms(exact, source, 1)
        add(f"{exact} >= 10x faster than baseline_torch ({source}), B = 1",
            None if None in (base, fast) else base / fast, 10.0, True)
        base, fast = ms("baseline_torch", source, 1, "graphs"), ms(exact, source, 1, "graphs")
        add(f"{exact} >= 10x faster than baseline_torch ({source}), B = 1, both as CUDA graphs",
            None if None in (base, fast) else base / fast, 10.0, True)
        floor, fast = ms("read_once_floor", source, 64), ms(exact, source, 64)
        add(f"{exact} within 2x of the read-once floor, B = 64",
            None if None in (floor, fast) else fast / floor, 2.0, False)
    for batch in BATCHES:
        exact, sigmoid = ms("exact_logits", "logits", batch), ms("sigmoid_logits", "logits", batch)
        add(f"sigmoid_logits >= 1.3x faster than exact_logits, B = {batch}",
            None if None in (exact, sigmoid) else exact / sigmoid, 1.3, True)
    return out

