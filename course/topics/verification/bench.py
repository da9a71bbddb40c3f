"""Notebook 16's measurements (token-tree verification): `python -m course bench verification` on a GPU.

`verification_rows()` measures on a GPU, for B in BATCHES and V = VOCABULARY, from float32
probabilities (the target and the draft as softmaxes of random logits with a controlled
mismatch, the draft tokens drawn from the draft):

- ``tree_sampling``: sampled verification of a 64-node tree whose siblings were drawn without
  replacement (Sequoia's rule, the launchers' default; the three kernels of
  solutions/tree_verification.py: the walk, the residual's tile sums, the draw);
- ``tree_sampling_with_replacement``: the same tree with siblings drawn independently
  (SpecInfer's rule, `replacement=True`): repeated siblings, fewer tokens accepted;
- ``chain_sampling``: the same kernels on a chain of gamma = 8 draft tokens (9 nodes), the
  course's reference point: the tree should cost at most 2x the chain;
- ``chain_spec_sampling``: notebook 15's tiled kernel on the same chain (when
  solutions/spec_sampling.py is there), the other reference point;
- ``tree_greedy``, ``chain_greedy``: greedy verification of the same trees from the same
  target probabilities, each launcher's default: the chain's 9 nodes get the argmax kernel
  (all nodes at once), then the walk; the 64-node tree the lazy walk (the argmax of the nodes
  on the path only);
- ``tree_greedy_all_argmax``: the tree with the argmax of all 64 nodes first (lazy=False), to
  show what the lazy walk saves.

Row mapping onto the shared schema (course.measure.results): H = 1, N = the tree's node count (9 for
the chain), d = V; extra fields V, nodes, gamma (chains), tree (its shape in words), mismatch,
accepted_mean (draft tokens accepted per tree, mean over the batch) and input
("probabilities"). max_abs_err is the share of trees whose (path, next token) differ from the
float64 torch reference (`course.oracle.sampling.tree_speculative_sampling`; greedy: from
pyspec_ref on torch's argmax): 0.0 means every tree agrees.

The rows (section "verification") go to results/<device>/verification.json; the verification figure
and the tree/chain targets: `python -m course figures verification`.
"""

from __future__ import annotations

import random

from course.core import impl, inputs, runtime
from course.measure import results, timing
from course.oracle import sampling as sampling_oracle

ROW_NAMES = ("tree_sampling", "tree_sampling_with_replacement", "chain_sampling", "chain_spec_sampling",
             "tree_greedy", "chain_greedy", "tree_greedy_all_argmax")
SUITE = "verification"
BATCHES = (1, 8, 64)
VOCABULARY = 128256
TREE_NODES = 64
CHAIN_GAMMA = 8
MAX_CHILDREN = 4  # the benchmark tree: random fan-out 1..4, numbered breadth first
MISMATCH = 1.0  # draft logits = target logits + MISMATCH * standard normal noise
SHARPNESS = 2.0  # target logits = SHARPNESS * standard normal
TARGET_RATIO = 2.0  # the course's target: tree verification within 2x of chain verification


def bench_tree(seed: int = 0) -> list[int]:
    """The benchmark's 64-node tree (the same shape for every batch entry)."""
    return inputs.random_tree(TREE_NODES, random.Random(seed), max_children=MAX_CHILDREN)


def bench_inputs(parents: list[int], batch: int, vocabulary: int, seed: int, device,
                 replacement: bool = False):
    """Tensors on the device for one measurement: (parents, tokens, q, p, accept, sample), the
    siblings drawn without replacement (or with).

    Generated on the device in float32 (the float64 CPU generator of the checks would take
    minutes at B = 64, V = 128256)."""
    import torch

    from course.topics.verification.check import draft_tokens

    n = len(parents)
    generator = torch.Generator(device=device).manual_seed(seed)
    target = SHARPNESS * torch.randn((batch, n, vocabulary), generator=generator, device=device)
    draft = target + MISMATCH * torch.randn((batch, n, vocabulary), generator=generator, device=device)
    p = torch.softmax(target, dim=-1)
    del target
    q = torch.softmax(draft, dim=-1)
    del draft
    tree = torch.tensor([parents] * batch, dtype=torch.int32, device=device)
    tokens = draft_tokens(tree, q, seed + 1, replacement)
    accept = torch.rand((batch, n), generator=generator, device=device)
    sample = torch.rand((batch, n), generator=generator, device=device)
    return tree, tokens, q, p, accept, sample


def _disagreement_sampling(tree, tokens, q, p, accept, sample, path, next_token, replacement=False) -> float:
    want_path, want_token = sampling_oracle.tree_speculative_sampling(tree.cpu(), tokens.cpu(), q, p,
                                                                      accept.cpu(), sample.cpu(),
                                                                      replacement=replacement)
    differs = (path.cpu() != want_path).any(dim=1) | (next_token.cpu() != want_token)
    return float(differs.double().mean())


def _disagreement_greedy(tree, tokens, p, path, next_token) -> float:
    from pyspec_ref.sampling import greedy_tree_verification

    best = p.argmax(dim=-1).cpu().tolist()
    parents, ids = tree.cpu().tolist(), tokens.cpu().tolist()
    wrong = 0
    for b, row in enumerate(path.cpu().tolist()):
        want_path, want_token = greedy_tree_verification(parents[b], ids[b], best[b])
        got_path = [x for x in row if x >= 0]
        wrong += (got_path, int(next_token[b])) != (want_path, want_token)
    return wrong / len(parents)


def _row(name, batch, parents, vocabulary, median_ms, error, **extra) -> dict:
    return {"name": name, "B": batch, "H": 1, "N": len(parents), "d": vocabulary,
            "median_ms": float(median_ms), "max_abs_err": float(error), "V": vocabulary,
            "nodes": len(parents), "mismatch": MISMATCH, "input": "probabilities", **extra}


def verification_rows(batches=BATCHES, vocabulary: int = VOCABULARY, seed: int = 0,
                      impl_name: str = "solutions") -> list[dict]:
    """The rows described in the module docstring, measured now (GPU only)."""
    if runtime.SIMULATOR:
        raise timing.NoTimingInSimulator(
            "verification_rows() times kernels on a GPU; in the simulator read the committed rows "
            "with course.topics.verification.bench.runtimes()")
    import torch

    from course.topics.verification import launch

    module = impl.load("tree_verification", impl_name)
    device = runtime.torch_device()
    shapes = [("tree", bench_tree(seed), f"random {TREE_NODES}-node tree, fan-out 1-{MAX_CHILDREN}", {}),
              ("chain", inputs.chain(CHAIN_GAMMA + 1), f"chain of gamma = {CHAIN_GAMMA} draft tokens",
               {"gamma": CHAIN_GAMMA})]
    rows = []
    for batch in batches:
        for kind, parents, words, extra in shapes:
            tensors = bench_inputs(parents, batch, vocabulary, seed + batch, device)
            tree, tokens, q, p, accept, sample = tensors
            sampled = launch.prepare_sampling(module, tree, tokens, q, p, accept, sample)
            path, next_token = sampled()
            path_chain = (path.clone(), next_token.clone())
            error = _disagreement_sampling(tree, tokens, q, p, accept, sample, path, next_token)
            accepted = float(launch.accepted_counts(path).double().mean())
            rows.append(_row(f"{kind}_sampling", batch, parents, vocabulary, timing.bench(sampled), error,
                             tree=words, accepted_mean=accepted, siblings="without replacement", **extra))
            if kind == "tree":
                rows.append(_with_replacement_row(module, parents, batch, vocabulary, seed + batch, device,
                                                  words))
            greedy = launch.prepare_greedy(module, tree, tokens, p)
            path, next_token = greedy()
            error = _disagreement_greedy(tree, tokens, p, path, next_token)
            accepted = float(launch.accepted_counts(path).double().mean())
            rows.append(_row(f"{kind}_greedy", batch, parents, vocabulary, timing.bench(greedy), error,
                             tree=words, accepted_mean=accepted, **extra))
            if kind == "tree":
                every_node = launch.prepare_greedy(module, tree, tokens, p, lazy=False)
                error = _disagreement_greedy(tree, tokens, p, *every_node())
                rows.append(_row("tree_greedy_all_argmax", batch, parents, vocabulary,
                                 timing.bench(every_node), error, tree=words, accepted_mean=accepted,
                                 **extra))
            if kind == "chain":
                rows.extend(_notebook15_chain_row(batch, parents, vocabulary, tensors, path_chain))
            del tensors, tree, tokens, q, p, accept, sample, sampled, greedy
            torch.cuda.empty_cache()
    return rows


def _with_replacement_row(module, parents, batch, vocabulary, seed, device, words) -> dict:
    """Row "tree_sampling_with_replacement": the tree's draft and target as in "tree_sampling", its
    siblings drawn independently and verified by SpecInfer's rule."""
    tree, tokens, q, p, accept, sample = bench_inputs(parents, batch, vocabulary, seed, device,
                                                      replacement=True)
    from course.topics.verification import launch

    run = launch.prepare_sampling(module, tree, tokens, q, p, accept, sample, replacement=True)
    path, next_token = run()
    error = _disagreement_sampling(tree, tokens, q, p, accept, sample, path, next_token, replacement=True)
    return _row("tree_sampling_with_replacement", batch, parents, vocabulary, timing.bench(run), error,
                tree=words, accepted_mean=float(launch.accepted_counts(path).double().mean()),
                siblings="with replacement")


def _notebook15_chain_row(batch, parents, vocabulary, tensors, tree_result) -> list[dict]:
    """Notebook 15's tiled kernel (solutions/spec_sampling.py) on the same chain, if it is there:
    row "chain_spec_sampling", whose max_abs_err is the share of samples where it disagrees
    with this notebook's walk on the chain (both equal pyspec_ref up to rounding)."""
    try:
        chain_module = impl.load("spec_sampling", "solutions")
        from course.topics.sampling.launch import prepare_sampling
    except ImportError:
        return []
    tree, tokens, q, p, accept, sample = tensors
    gamma = len(parents) - 1
    run = prepare_sampling(chain_module, tokens[:, 1:].contiguous(), q[:, :gamma].contiguous(), p,
                           accept[:, 1:].contiguous(), sample, form="probs")
    accepted, emitted = run()
    path, next_token = tree_result
    mine = (path >= 0).sum(dim=1) - 1
    drawn = emitted.gather(1, accepted.long()[:, None])[:, 0]
    error = float(((accepted != mine) | (drawn.to(next_token.dtype) != next_token)).double().mean())
    return [_row("chain_spec_sampling", batch, parents, vocabulary, timing.bench(run), error,
                 tree=f"chain of gamma = {gamma} draft tokens, notebook 15's kernel", gamma=gamma,
                 accepted_mean=float(accepted.double().mean()))]


def section_rows() -> list[dict]:
    """The rows of section "verification", each checked against the results schema: a malformed row
    is left out (and named) rather than cost the measurements saved with it."""
    rows = []
    for row in verification_rows():
        row = dict({"section": "verification"}, **row)
        try:
            results.validate({"suite": SUITE, "device": "", "date": "2000-01-01", "software": {},
                              "rows": [row]})
        except ValueError as error:
            print(f"left out a verification row: {error}", flush=True)
            continue
        rows.append(row)
    return rows


SECTIONS = {"verification": section_rows}


def section_of(row: dict) -> str:
    """Every row of verification.json comes from the one section."""
    return "verification"


def committed_rows(device: str | None = None) -> list[dict] | None:
    """This suite's committed rows of notebook 16 (results/<device>/verification.json), or None when
    none are committed yet."""
    try:
        document = results.load(SUITE, device)
    except FileNotFoundError:
        return None
    rows = [row for row in document["rows"] if row.get("name") in ROW_NAMES]
    return rows or None


def runtimes(device: str | None = None) -> list[dict] | None:
    """Rows for the notebook: measured now on a GPU, else the committed ones (None: not measured
    yet)."""
    if runtime.on_gpu():
        return verification_rows()
    return committed_rows(device)


COMPARISONS = (("sampling", "tree_sampling", "chain_sampling"),
               ("sampling vs notebook 15", "tree_sampling", "chain_spec_sampling"),
               ("greedy", "tree_greedy", "chain_greedy"))


def targets(rows: list[dict]) -> list[dict]:
    """Per B and comparison: tree time / chain time, and whether it is within TARGET_RATIO."""
    out = []
    by_key = {(row["name"], row["B"]): row for row in rows}
    for method, tree_name, chain_name in COMPARISONS:
        for batch in sorted({row["B"] for row in rows}):
            tree, chain = by_key.get((tree_name, batch)), by_key.get((chain_name, batch))
            if tree is None or chain is None:
                continue
            ratio = tree["median_ms"] / chain["median_ms"]
            out.append({"method": method, "B": batch, "tree_ms": tree["median_ms"],
                        "chain_ms": chain["median_ms"], "ratio": ratio, "met": ratio <= TARGET_RATIO})
    return out
