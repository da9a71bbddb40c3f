"""Which tree a round drafts: the three shapes of `python -m course generate --tree` (notebook 21).

* "fixed": the capstone's first tree, (tree_size, width, branch, steps) = FIXED, ranked by the draft's
  cumulative log-probability in greedy mode and by the parent's in sample mode, no measured prior.
* "sequoia": Sequoia's tree for a budget and a depth (Chen et al., 2024, §3.1): the dynamic program of
  `pyspec_ref.tree_shape` over the pair's measured acceptance vector (`acceptance`), drafted on the GPU
  as a best-first growth whose keys are the logs of those rates summed along each path (key "static"
  of `course.capstone.tree`). The shape is fixed before any draw, so sampling stays exact.
* "dynamic": EAGLE-2's tree (Li et al., 2024, §4): each step expands the most promising frontier
  nodes, and the round verifies the best `tree_size` of everything drafted, ranked by the draft's
  own confidence (its cumulative log-probability) in greedy mode; in sample mode a node may not be
  ranked by its own draw, so it is ranked by its parent's confidence plus the measured prior of its
  sibling rank (key "parent").

The acceptance vector r[k]: the probability that a node's k-th child (in draw order) is the child the
verification accepts, measured on held-out text (`acceptance`). Sequoia's positional assumption makes
it the same at every depth; the course measures it with the target's own context, which on an
accepted path is what every depth sees (the accepted tokens are the target's), so one row serves all
levels.
"""

from __future__ import annotations

import math

import torch

from pyspec_ref.tree_shape import best_tree, check_acceptance, tree_depth

from .tree import PARENT, DraftTrees, schedule

TREES = ("fixed", "sequoia", "dynamic")
FIXED = (48, 4, 4, 8)  # (tree_size, width, branch, steps): the capstone's first tree
SMALL = (16, 2, 4, 6)  # the same for the tiny pair of the simulator, whose positions end at 128
RANKS = 4  # child ranks measured (and the most children a Sequoia node gets)
MAX_BUDGET, MAX_DEPTH = 128, 16  # Sequoia's program is pure Python: O(budget^2 x depth x RANKS)
FLOOR = 1e-6  # an acceptance rate below this counts as never: its log would swamp the keys


# --------------------------------------------------------------------------- the acceptance vector


def _probabilities(model, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(tokens, validate=False).float()
    return torch.softmax(logits / temperature, dim=-1).double().reshape(-1, logits.shape[-1])


def _greedy_ranks(p: torch.Tensor, q: torch.Tensor, ranks: int) -> list[float]:
    """r[k] = how often the target's argmax is the draft's k-th most likely token."""
    best = p.argmax(dim=-1, keepdim=True)
    order = torch.topk(q, ranks, dim=-1).indices
    return (order == best).double().mean(dim=0).tolist()


def _sampled_ranks(p: torch.Tensor, q: torch.Tensor, ranks: int, draws: int,
                   gen: torch.Generator) -> list[float]:
    """r[k] = how often the walk accepts the k-th sibling, siblings drawn from q without replacement
    (Gumbel top-k) and verified by Sequoia's rule, Monte Carlo over `draws` walks per position."""
    p = p.repeat_interleave(draws, dim=0)
    q = q.repeat_interleave(draws, dim=0)
    gumbel = -torch.log(-torch.log(torch.rand(q.shape, generator=gen, dtype=torch.float64).clamp(min=1e-300)))
    siblings = torch.topk(torch.log(q.clamp(min=1e-300)) + gumbel, ranks, dim=-1).indices
    current, proposal = p.clone(), q.clone()
    open_ = torch.ones(p.shape[0], dtype=torch.bool)
    accepted = []
    for k in range(ranks):
        x = siblings[:, k:k + 1]
        r = torch.rand((p.shape[0], 1), generator=gen, dtype=torch.float64)
        accept = open_ & (r * proposal.gather(1, x) < current.gather(1, x))[:, 0]
        accepted.append(accept.double().mean().item())
        open_ &= ~accept
        residual = (current - proposal).clamp(min=0.0)
        total = residual.sum(dim=1, keepdim=True)
        current = torch.where(total > 0, residual / total.clamp(min=1e-300), current)
        proposal = proposal.scatter(1, x, 0.0)
        proposal = proposal / proposal.sum(dim=1, keepdim=True).clamp(min=1e-300)
    return accepted


def acceptance(pair, mode: str, temperature: float = 1.0, ranks: int = RANKS, windows: int = 16,
               seq_len: int = 128, draws: int = 8, seed: int = 0) -> list[float]:
    """The pair's acceptance vector r[0..ranks) on held-out text (`train.heldout_windows`), greedy or
    sampling at `temperature`."""
    from .train import heldout_windows

    seq_len = min(seq_len, pair.target.config.max_positions, pair.draft.config.max_positions)
    tokens = heldout_windows(seq_len)[:windows, :seq_len].to(pair.target.device)
    p = _probabilities(pair.target, tokens, temperature).cpu()
    q = _probabilities(pair.draft, tokens, temperature).cpu()
    if mode == "greedy":
        return _greedy_ranks(p, q, ranks)
    return _sampled_ranks(p, q, ranks, draws, torch.Generator().manual_seed(seed))


def log_prior(rates, steps: int, branch: int) -> list[list[float]]:
    """The (steps, branch) bias of `course.capstone.tree`: log r[k], each rate first lowered to the
    smallest of the rates before it (a younger sibling never ranks above an elder one: the verified
    siblings stay a prefix of the draw order, which exact sampling needs)."""
    rates = check_acceptance(list(rates)[:branch], 1)[0]
    row, smallest = [], 1.0
    for k in range(branch):
        smallest = min(smallest, rates[k] if k < len(rates) else 0.0)
        row.append(math.log(smallest) if smallest > FLOOR else -math.inf)
    return [row] * steps


# --------------------------------------------------------------------------- shapes


def _expected(paths: set[tuple[int, ...]], rates: list[float]) -> float:
    """Expected tokens per call of the tree whose nodes have these rank paths
    (`pyspec_ref.tree_shape.expected_tokens`)."""
    return math.fsum(math.prod(rates[k] for k in path) for path in paths)


def grown_paths(tree_size: int, width: int, branch: int, steps: int, bias) -> set[tuple[int, ...]]:
    """The rank paths of the nodes the decoder verifies with key "static" and this bias: the GPU's
    own rule (`DraftTrees`), run on the CPU."""
    trees = DraftTrees(1, schedule(steps, width, branch), "greedy", 2, "cpu", key="static", bias=bias)
    trees.reset(torch.zeros(1, dtype=torch.float64))
    for step in range(steps):
        ids = trees.pick(step)
        runs = ids.shape[1]
        zeros = torch.zeros((1, runs, branch))
        trees.add_children(step, trees.rows(ids), zeros.long(), zeros)
    chosen = trees.choose(tree_size, torch.zeros((1, trees.plan.size), dtype=torch.int64))
    table = trees.table[0]
    ids = chosen.ids[0].tolist()
    paths = {0: ()}
    for node in ids[1:]:  # ascending ids: a parent before its children
        paths[node] = paths[int(table[node, PARENT])] + (_sibling_rank(trees, node),)
    return set(paths.values())


def _sibling_rank(trees: DraftTrees, node: int) -> int:
    """A node's rank among its siblings: its offset in its step's block modulo branch."""
    plan = trees.plan
    for step in range(plan.steps):
        first, stop = plan.block(step)
        if first <= node < stop:
            return (node - first) % plan.branch
    raise ValueError(f"node {node} is in no step's block")


def sequoia(rates, budget: int, max_depth: int) -> dict:
    """Sequoia's tree for `budget` verified nodes and depth `max_depth`, as the decoder's settings:
    tree_size, width, branch, steps, key "static" and its bias, with the dynamic program's predicted
    tokens per call. The width is the smallest whose best-first growth holds the whole tree."""
    limits = (("budget (tree_size)", budget, MAX_BUDGET), ("max_depth (steps)", max_depth, MAX_DEPTH))
    for name, value, top in limits:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise ValueError(f"{name} must be an int in [1, {top}] for Sequoia's tree, got {value!r}")
    rates = check_acceptance(list(rates), 1)[0]
    parents, ranks, predicted = best_tree(rates, budget, max_depth)
    if len(parents) == 1:
        raise ValueError(f"acceptance {rates}: no child is ever accepted, so the best tree is the root alone")
    branch = max(ranks) + 1
    steps = tree_depth(parents)
    bias = log_prior(rates, steps, branch)
    for width in range(1, len(parents) + 1):
        if schedule(steps, width, branch).size < len(parents):
            continue
        grown = grown_paths(len(parents), width, branch, steps, bias)
        if math.isclose(_expected(grown, rates), predicted, rel_tol=1e-9):  # an optimal tree (ties allowed)
            return dict(tree_size=len(parents), width=width, branch=branch, steps=steps, key="static",
                        bias=bias, predicted_tokens_per_call=predicted)
    raise ValueError(f"no width grows Sequoia's tree of {len(parents)} nodes in {steps} steps")


def settings_for(kind: str, rates, mode: str, *, tree_size: int | None = None, width: int | None = None,
                 branch: int | None = None, steps: int | None = None, max_depth: int | None = None,
                 default=FIXED) -> dict:
    """The decoder's keyword settings for tree `kind` (see the module docstring). fixed and dynamic
    take (tree_size, width, branch, steps), `default` where not given; sequoia takes tree_size (the
    budget) and max_depth, default[0] and default[3] where not given."""
    if kind not in TREES:
        raise ValueError(f"tree must be one of {TREES}, got {kind!r}")
    if kind == "sequoia":
        return sequoia(rates, tree_size or default[0], max_depth or default[3])
    shape = dict(zip(("tree_size", "width", "branch", "steps"), default, strict=True))
    given = dict(tree_size=tree_size, width=width, branch=branch, steps=steps)
    shape.update({k: v for k, v in given.items() if v is not None})
    if kind == "dynamic" and mode == "sample":
        shape["bias"] = log_prior(rates, shape["steps"], shape["branch"])
    return shape
