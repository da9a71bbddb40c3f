"""A round's bookkeeping, stated in torch (`TorchBookkeeping`) and fused into one Triton kernel per
phase (`FusedBookkeeping`, `course.capstone.kernels`): the same reads and writes of the decoder's
buffers, the same results (tests/test_capstone_decoder.py compares them).

What the bookkeeping reads and writes is passed in, explicitly: a `Progress` (what every decoder keeps
per sample) or a `RoundState` (a speculative round's buffers, its `progress` among them). Both hold
the decoder's own tensors, allocated once when it is built and only ever written in place, so that
a CUDA graph captured over them replays on whatever they hold (`course.capstone.decoder` builds them;
`decoder.implementations` says which of the two classes runs).

The operations, for the state `s`:

* `draft_inputs(s, step)`: the queries of a draft step into s.draft_inputs[step] (tokens, positions,
  cache rows, node ids) and the step's index (the queries' intervals); the nodes are marked as run.
* `add_children(s, step, tokens, logp)`: the children the draft gave those nodes (tokens and their
  log-probabilities, drawn by `DraftTrees.children`) into the tree and the draft's interval rows.
* `choose(s)`: the nodes verified (`DraftTrees.choose`) and everything the target pass and the
  verification read about them.
* `commit(s)`: after verification, the accepted path's moves in both caches (into the move buffers;
  the compaction kernels run next), the emitted tokens, the next round's state and its fresh trees.
* `advance(progress, logits, token)`: plain decoding's step after the target pass.

The torch statement is what to read; with models this small each of its operations is a kernel
whose launch outlasts its work (20 to 80 per phase), which is why the decoder runs the fused one
by default with the course's kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from . import kernels
from .backends import TreeIndex
from .tree import DEPTH, END, FIELDS, ID, KEYS, OPEN, START, TOKEN, DraftTrees, Schedule

if TYPE_CHECKING:  # for the annotations only: the decoder imports this module
    from .decoder import StepInputs


@dataclass(frozen=True)
class Progress:
    """What every decoder keeps per sample on the device, (B,) unless said: where each sample is."""

    prefix: torch.Tensor  # committed tokens whose KV is cached (int64)
    prefix32: torch.Tensor  # the same, int32, for the kernels
    root: torch.Tensor  # the last committed token (not yet cached)
    n_out: torch.Tensor  # tokens emitted so far
    done: torch.Tensor  # finished (bool)
    limit: torch.Tensor  # (1,): max_new_tokens of the running generation
    eos: torch.Tensor  # (1,): the end token, -1 for none
    out: torch.Tensor  # (B, capacity + 1): the emitted tokens; the last column is scratch
    counter: torch.Tensor  # (1,): rounds (or steps) so far, the row of the uniforms
    status: torch.Tensor  # (3, B): done, accepted this round (-1: inactive), n_out (the host's one read)
    uniforms: torch.Tensor | None  # (rounds, B, per round) float64 in sample mode, else None

    @property
    def batch(self) -> int:
        return self.prefix.shape[0]


@dataclass(frozen=True)
class Moves:
    """One cache's compaction buffers, (B, tree_size) int32 src and dst rows and (B,) counts."""

    src: torch.Tensor
    dst: torch.Tensor
    counts: torch.Tensor


@dataclass(frozen=True)
class RoundState:
    """What a speculative round's bookkeeping reads and writes (see the module docstring)."""

    progress: Progress
    tree: DraftTrees  # every sample's draft tree (`course.capstone.tree`)
    plan: Schedule  # the round's fixed schedule of draft steps
    tree_size: int  # nodes verified per round
    draft_inputs: list[StepInputs]  # per draft step: its tokens, positions, cache rows, node ids
    draft_index: list[TreeIndex]  # per draft step: the queries' intervals
    draft_kv_start: torch.Tensor  # (B, rows) int32: the interval of each draft cache row
    draft_kv_end: torch.Tensor
    scratch_row: int  # the draft cache's row for writes that are dropped
    lag: torch.Tensor  # (B,) bool: the draft has not run lag_token yet
    lag_token: torch.Tensor  # (B,) the last accepted token, when the draft has not run it
    local: torch.Tensor  # (B, plan.size): tree id -> its slot among the verified nodes
    slots: torch.Tensor  # (tree_size,): 0 .. tree_size - 1
    chosen: torch.Tensor  # (B, tree_size): the tree ids of the verified nodes
    target_inputs: StepInputs  # the target pass's
    target_index: TreeIndex
    verify_parents: torch.Tensor  # (B, tree_size) int32: the verifier's tree
    verify_tokens: torch.Tensor
    path: torch.Tensor  # (B, tree_size): the verifier's accepted path (slots; -1 past its end)
    next_token: torch.Tensor  # (B,): the verifier's token after the path
    moves: dict[str, Moves]  # "target", "draft": that cache's


def reset_trees(s: RoundState) -> None:
    """Every sample's next tree: its root alone, its interval at the root's draft cache row."""
    p = s.progress
    s.tree.reset(p.root)
    s.draft_kv_start.scatter_(1, p.prefix[:, None], 0)
    s.draft_kv_end.scatter_(1, p.prefix[:, None], s.plan.spans[0] - 1)


class TorchBookkeeping:
    """The bookkeeping in torch operations (see the module docstring)."""

    name = "torch"

    def draft_inputs(self, s: RoundState, step: int) -> None:
        p = s.progress
        inputs, index = s.draft_inputs[step], s.draft_index[step]
        here = p.prefix
        if step == 0:  # slot 0: the lag token (or a padding slot on the scratch row), slot 1: the root
            inputs.tokens.copy_(torch.stack([s.lag_token, p.root], dim=1))
            inputs.positions.copy_(torch.stack([(here - 1).clamp(min=0), here], dim=1))
            inputs.rows.copy_(torch.stack([torch.where(s.lag, here - 1, s.scratch_row), here], dim=1))
            inputs.ids.copy_(s.tree.pick(0))
            return
        ids = s.tree.pick(step)
        rows = s.tree.rows(ids)
        inputs.ids.copy_(ids)
        inputs.tokens.copy_(rows[..., TOKEN])
        inputs.positions.copy_(here[:, None] + rows[..., DEPTH].long())
        inputs.rows.copy_(here[:, None] + ids)
        index.q_start.copy_(rows[..., START])
        index.q_end.copy_(rows[..., END])

    def add_children(self, s: RoundState, step: int, tokens: torch.Tensor, logp: torch.Tensor) -> None:
        ids = s.draft_inputs[step].ids
        children = s.tree.add_children(step, s.tree.rows(ids), tokens, logp)
        # Each child's interval, at the draft cache row its KV will take if it is run.
        rows = s.progress.prefix[:, None] + children[..., ID].long()
        s.draft_kv_start.scatter_(1, rows, children[..., START].to(torch.int32))
        s.draft_kv_end.scatter_(1, rows, children[..., END].to(torch.int32))

    def choose(self, s: RoundState) -> None:
        prefix = s.progress.prefix
        chosen = s.tree.choose(s.tree_size, s.local)
        inputs, index = s.target_inputs, s.target_index
        s.chosen.copy_(chosen.ids)
        inputs.tokens.copy_(chosen.rows[..., TOKEN])
        inputs.positions.copy_(prefix[:, None] + chosen.rows[..., DEPTH].long())
        inputs.rows.copy_(prefix[:, None] + s.slots)
        index.q_start.copy_(chosen.rows[..., START])
        index.q_end.copy_(chosen.rows[..., END])
        index.kv_start.scatter_(1, inputs.rows, index.q_start)
        index.kv_end.scatter_(1, inputs.rows, index.q_end)
        s.verify_parents.copy_(chosen.parents)
        s.verify_tokens.copy_(inputs.tokens)

    def commit(self, s: RoundState) -> None:
        p = s.progress
        active = ~p.done
        path = s.path.long()
        accepted = (path >= 0).sum(dim=1) - 1
        node = s.chosen.gather(1, path.clamp(min=0))  # the path's draft-tree ids
        last = node.gather(1, accepted[:, None])
        last_run = (s.tree.table[:, :, OPEN].gather(1, last) == -torch.inf)[:, 0]
        dst = p.prefix[:, None] + s.slots
        # The path's KV rows move to the prefix's end, in both caches (the draft's last node only if
        # the draft ran it: else it is next round's lag token).
        for name, src, count in (("target", p.prefix[:, None] + path.clamp(min=0), accepted + 1),
                                 ("draft", p.prefix[:, None] + node, accepted + last_run.long())):
            moves = s.moves[name]
            moves.src.copy_(src)
            moves.dst.copy_(dst)
            moves.counts.copy_(count * active)
        # Emitted: the path's tokens after the root, then the next token.
        path_tokens = s.tree.table[:, :, TOKEN].gather(1, node).long()
        emitted = torch.where(s.slots == accepted[:, None], s.next_token.long()[:, None],
                              path_tokens.roll(-1, dims=1))
        valid = (s.slots <= accepted[:, None]) & active[:, None]
        scratch = p.out.shape[1] - 1
        p.out.scatter_(1, torch.where(valid, (p.n_out[:, None] + s.slots).clamp(max=scratch), scratch),
                       emitted)
        hit_eos = (valid & (emitted == p.eos)).any(dim=1)
        step = (accepted + 1) * active
        p.n_out.add_(step)
        s.lag_token.copy_(path_tokens.gather(1, accepted[:, None])[:, 0])
        s.lag.copy_(active & ~last_run)
        p.prefix.add_(step)
        p.prefix32.copy_(p.prefix)
        p.root.copy_(torch.where(active, s.next_token.long(), p.root))
        p.done.bitwise_or_(hit_eos | (p.n_out >= p.limit))
        p.status[0].copy_(p.done)
        p.status[1].copy_(torch.where(active, accepted, -1))
        p.status[2].copy_(p.n_out)
        if p.uniforms is not None:
            p.counter.add_(1).clamp_(max=p.uniforms.shape[0] - 1)
        reset_trees(s)

    def advance(self, p: Progress, logits: torch.Tensor, token: torch.Tensor | None) -> None:
        active = ~p.done
        if token is None:
            token = logits.argmax(dim=-1)
        else:
            p.counter.add_(1).clamp_(max=p.uniforms.shape[0] - 1)
        scratch = p.out.shape[1] - 1
        p.out.scatter_(1, torch.where(active, p.n_out.clamp(max=scratch), scratch)[:, None], token[:, None])
        p.n_out.add_(active)
        p.prefix.add_(active)
        p.prefix32.copy_(p.prefix)
        p.root.copy_(torch.where(active, token, p.root))
        p.done.bitwise_or_((p.n_out >= p.limit) | (token == p.eos))


class FusedBookkeeping:
    """The same bookkeeping, one Triton kernel per phase (`course.capstone.kernels`)."""

    name = "fused"

    @staticmethod
    def _tree_args(s: RoundState) -> dict:
        return dict(SIZE=s.plan.size, FIELDS_=FIELDS)

    def draft_inputs(self, s: RoundState, step: int) -> None:
        p = s.progress
        inputs, index = s.draft_inputs[step], s.draft_index[step]
        plan = s.plan
        kernels.draft_inputs_kernel[(p.batch,)](
            s.tree.table, p.prefix, s.lag, s.lag_token, p.root, inputs.tokens, inputs.positions, inputs.rows,
            index.q_start, index.q_end, inputs.ids, s.scratch_row, plan.before[step],
            RUNS=plan.runs[step], WIDTH=inputs.tokens.shape[1], FIRST=step == 0,
            BLOCK=kernels.block(plan.before[step]), **self._tree_args(s))

    def add_children(self, s: RoundState, step: int, tokens: torch.Tensor, logp: torch.Tensor) -> None:
        plan = s.plan
        kernels.add_children_kernel[(s.progress.batch, plan.runs[step])](
            s.tree.table, s.progress.prefix, s.draft_inputs[step].ids, tokens.contiguous(), logp.contiguous(),
            s.tree.bias, s.draft_kv_start, s.draft_kv_end, s.tree.spans, s.draft_kv_start.shape[1],
            plan.block(step)[0], RUNS=plan.runs[step],
            BRANCH=plan.branch, KEY_RULE=KEYS.index(s.tree.key), EPS_=kernels.EPS,
            BLOCK_K=kernels.block(plan.branch), **self._tree_args(s))

    def choose(self, s: RoundState) -> None:
        inputs, index = s.target_inputs, s.target_index
        n = s.tree_size
        kernels.choose_kernel[(s.progress.batch,)](
            s.tree.table, s.progress.prefix, s.local, s.chosen, inputs.tokens, inputs.positions, inputs.rows,
            index.q_start, index.q_end, index.kv_start, index.kv_end, s.verify_parents, s.verify_tokens,
            index.kv_start.shape[1], N=n, BLOCK=kernels.block(s.plan.size), BLOCK_N=kernels.block(n),
            **self._tree_args(s))

    def commit(self, s: RoundState) -> None:
        p = s.progress
        n = s.tree_size
        target, draft = s.moves["target"], s.moves["draft"]
        rounds = p.uniforms.shape[0] if p.uniforms is not None else 1
        kernels.commit_kernel[(p.batch,)](
            s.path, s.next_token, s.chosen, s.tree.table, p.prefix, p.prefix32, p.root, p.n_out, p.done,
            p.limit,
            p.eos, p.out, s.lag, s.lag_token, p.status, p.counter, target.src, target.dst, target.counts,
            draft.src, draft.dst, draft.counts, s.draft_kv_start, s.draft_kv_end, p.batch, p.out.shape[1],
            s.draft_kv_start.shape[1], rounds - 1, s.plan.spans[0] - 1, N=n, COUNT=p.uniforms is not None,
            BLOCK_N=kernels.block(n), **self._tree_args(s))

    def advance(self, p: Progress, logits: torch.Tensor, token: torch.Tensor | None) -> None:
        vocab = logits.shape[-1]
        steps = p.uniforms.shape[0] if p.uniforms is not None else 1
        kernels.plain_advance_kernel[(p.batch,)](
            logits.contiguous(), token if token is not None else p.root, p.prefix, p.prefix32, p.root,
            p.n_out, p.done, p.limit, p.eos, p.out, p.counter, p.out.shape[1], steps - 1, V=vocab,
            GREEDY=token is None, BLOCK_V=kernels.block(vocab))
