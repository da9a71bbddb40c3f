"""A round's bookkeeping, stated in torch (`TorchBookkeeping`) and fused into one Triton kernel per
phase (`FusedBookkeeping`, `course.capstone.kernels`): the same reads and writes of the decoder's
buffers, the same results (tests/test_capstone_decoder.py compares them).

The operations, for the decoder `d` (a SpeculativeDecoder, or a PlainDecoder for `advance`):

* `draft_inputs(step)`: the queries of a draft step into d.step_inputs[step] (tokens, positions,
  cache rows, node ids) and the step's index (the queries' intervals); the nodes are marked as run.
* `add_children(step, tokens, logp)`: the children the draft gave those nodes (tokens and their
  log-probabilities, drawn by `DraftTrees.children`) into the tree and the draft's interval rows.
* `choose()`: the nodes verified (`DraftTrees.choose`) and everything the target pass and the
  verification read about them.
* `commit()`: after verification, the accepted path's moves in both caches (into the move buffers;
  the compaction kernels run next), the emitted tokens, the next round's state and its fresh trees.
* `advance(logits, token)`: plain decoding's step after the target pass.

The torch statement is what to read; with models this small each of its operations is a kernel
whose launch outlasts its work (20 to 80 per phase), which is why the decoder runs the fused one
by default with the course's kernels.
"""

from __future__ import annotations

import torch

from . import kernels
from .tree import DEPTH, END, FIELDS, ID, KEYS, OPEN, START, TOKEN

BOOKKEEPING = ("torch", "fused")


class TorchBookkeeping:
    """The bookkeeping in torch operations (see the module docstring)."""

    name = "torch"

    def __init__(self, decoder):
        self.d = decoder

    def draft_inputs(self, step: int) -> None:
        d = self.d
        inputs, index = d.step_inputs[step], d.d_index[step]
        here = d.prefix
        if step == 0:  # slot 0: the lag token (or a padding slot on the scratch row), slot 1: the root
            inputs.tokens.copy_(torch.stack([d.lag_token, d.root], dim=1))
            inputs.positions.copy_(torch.stack([(here - 1).clamp(min=0), here], dim=1))
            inputs.rows.copy_(torch.stack([torch.where(d.lag, here - 1, d.d_cache.scratch_row), here], dim=1))
            inputs.ids.copy_(d.tree.pick(0))
            return
        ids = d.tree.pick(step)
        rows = d.tree.rows(ids)
        inputs.ids.copy_(ids)
        inputs.tokens.copy_(rows[..., TOKEN])
        inputs.positions.copy_(here[:, None] + rows[..., DEPTH].long())
        inputs.rows.copy_(here[:, None] + ids)
        index.q_start.copy_(rows[..., START])
        index.q_end.copy_(rows[..., END])

    def add_children(self, step: int, tokens: torch.Tensor, logp: torch.Tensor) -> None:
        d = self.d
        ids = d.step_inputs[step].ids
        children = d.tree.add_children(step, d.tree.rows(ids), tokens, logp)
        # Each child's interval, at the draft cache row its KV will take if it is run.
        rows = d.prefix[:, None] + children[..., ID].long()
        d.d_kv_start.scatter_(1, rows, children[..., START].to(torch.int32))
        d.d_kv_end.scatter_(1, rows, children[..., END].to(torch.int32))

    def choose(self) -> None:
        d = self.d
        chosen = d.tree.choose(d.settings.tree_size, d.local)
        inputs, index = d.t_inputs, d.t_index
        d.chosen.copy_(chosen.ids)
        inputs.tokens.copy_(chosen.rows[..., TOKEN])
        inputs.positions.copy_(d.prefix[:, None] + chosen.rows[..., DEPTH].long())
        inputs.rows.copy_(d.prefix[:, None] + d.slots)
        index.q_start.copy_(chosen.rows[..., START])
        index.q_end.copy_(chosen.rows[..., END])
        index.kv_start.scatter_(1, inputs.rows, index.q_start)
        index.kv_end.scatter_(1, inputs.rows, index.q_end)
        d.v_parents.copy_(chosen.parents)
        d.v_tokens.copy_(inputs.tokens)

    def commit(self) -> None:
        d = self.d
        active = ~d.done
        path = d.path.long()
        accepted = (path >= 0).sum(dim=1) - 1
        node = d.chosen.gather(1, path.clamp(min=0))  # the path's draft-tree ids
        last = node.gather(1, accepted[:, None])
        last_run = (d.tree.table[:, :, OPEN].gather(1, last) == -torch.inf)[:, 0]
        dst = d.prefix[:, None] + d.slots
        # The path's KV rows move to the prefix's end, in both caches (the draft's last node only if
        # the draft ran it: else it is next round's lag token).
        for name, src, count in (("target", d.prefix[:, None] + path.clamp(min=0), accepted + 1),
                                 ("draft", d.prefix[:, None] + node, accepted + last_run.long())):
            src_buf, dst_buf, counts_buf, _ = d.moves[name]
            src_buf.copy_(src)
            dst_buf.copy_(dst)
            counts_buf.copy_(count * active)
        # Emitted: the path's tokens after the root, then the next token.
        path_tokens = d.tree.table[:, :, TOKEN].gather(1, node).long()
        emitted = torch.where(d.slots == accepted[:, None], d.next_token.long()[:, None],
                              path_tokens.roll(-1, dims=1))
        valid = (d.slots <= accepted[:, None]) & active[:, None]
        scratch = d.out.shape[1] - 1
        d.out.scatter_(1, torch.where(valid, (d.n_out[:, None] + d.slots).clamp(max=scratch), scratch),
                       emitted)
        hit_eos = (valid & (emitted == d.eos)).any(dim=1)
        step = (accepted + 1) * active
        d.n_out.add_(step)
        d.lag_token.copy_(path_tokens.gather(1, accepted[:, None])[:, 0])
        d.lag.copy_(active & ~last_run)
        d.prefix.add_(step)
        d.prefix32.copy_(d.prefix)
        d.root.copy_(torch.where(active, d.next_token.long(), d.root))
        d.done |= hit_eos | (d.n_out >= d.limit)
        d.status[0].copy_(d.done)
        d.status[1].copy_(torch.where(active, accepted, -1))
        d.status[2].copy_(d.n_out)
        if d.uniforms is not None:
            d.counter.add_(1).clamp_(max=d.uniforms.shape[0] - 1)
        d.new_trees()

    def advance(self, logits: torch.Tensor, token: torch.Tensor | None) -> None:
        d = self.d
        active = ~d.done
        if token is None:
            token = logits.argmax(dim=-1)
        else:
            d.counter.add_(1).clamp_(max=d.uniforms.shape[0] - 1)
        scratch = d.out.shape[1] - 1
        d.out.scatter_(1, torch.where(active, d.n_out.clamp(max=scratch), scratch)[:, None], token[:, None])
        d.n_out.add_(active)
        d.prefix.add_(active)
        d.prefix32.copy_(d.prefix)
        d.root.copy_(torch.where(active, token, d.root))
        d.done |= (d.n_out >= d.limit) | (token == d.eos)


class FusedBookkeeping:
    """The same bookkeeping, one Triton kernel per phase (`course.capstone.kernels`)."""

    name = "fused"

    def __init__(self, decoder):
        self.d = decoder

    def _tree_args(self):
        d = self.d
        return dict(SIZE=d.plan.size, FIELDS_=FIELDS)

    def draft_inputs(self, step: int) -> None:
        d = self.d
        inputs, index = d.step_inputs[step], d.d_index[step]
        plan = d.plan
        kernels.draft_inputs_kernel[(d.batch,)](
            d.tree.table, d.prefix, d.lag, d.lag_token, d.root, inputs.tokens, inputs.positions, inputs.rows,
            index.q_start, index.q_end, inputs.ids, d.d_cache.scratch_row, plan.before[step],
            RUNS=plan.runs[step], WIDTH=inputs.tokens.shape[1], FIRST=step == 0,
            BLOCK=kernels.block(plan.before[step]), **self._tree_args())

    def add_children(self, step: int, tokens: torch.Tensor, logp: torch.Tensor) -> None:
        d = self.d
        plan = d.plan
        kernels.add_children_kernel[(d.batch, plan.runs[step])](
            d.tree.table, d.prefix, d.step_inputs[step].ids, tokens.contiguous(), logp.contiguous(),
            d.tree.bias, d.d_kv_start, d.d_kv_end, d.tree.spans, d.d_kv_start.shape[1], plan.block(step)[0],
            RUNS=plan.runs[step],
            BRANCH=plan.branch, KEY_RULE=KEYS.index(d.tree.key), EPS_=kernels.EPS,
            BLOCK_K=kernels.block(plan.branch), **self._tree_args())

    def choose(self) -> None:
        d = self.d
        inputs, index = d.t_inputs, d.t_index
        n = d.settings.tree_size
        kernels.choose_kernel[(d.batch,)](
            d.tree.table, d.prefix, d.local, d.chosen, inputs.tokens, inputs.positions, inputs.rows,
            index.q_start, index.q_end, index.kv_start, index.kv_end, d.v_parents, d.v_tokens,
            index.kv_start.shape[1], N=n, BLOCK=kernels.block(d.plan.size), BLOCK_N=kernels.block(n),
            **self._tree_args())

    def commit(self) -> None:
        d = self.d
        n = d.settings.tree_size
        t_src, t_dst, t_counts, _ = d.moves["target"]
        d_src, d_dst, d_counts, _ = d.moves["draft"]
        rounds = d.uniforms.shape[0] if d.uniforms is not None else 1
        kernels.commit_kernel[(d.batch,)](
            d.path, d.next_token, d.chosen, d.tree.table, d.prefix, d.prefix32, d.root, d.n_out, d.done,
            d.limit,
            d.eos, d.out, d.lag, d.lag_token, d.status, d.counter, t_src, t_dst, t_counts, d_src, d_dst,
            d_counts, d.d_kv_start, d.d_kv_end, d.batch, d.out.shape[1], d.d_kv_start.shape[1], rounds - 1,
            d.plan.spans[0] - 1, N=n, COUNT=d.uniforms is not None, BLOCK_N=kernels.block(n),
            **self._tree_args())

    def advance(self, logits: torch.Tensor, token: torch.Tensor | None) -> None:
        d = self.d
        vocab = logits.shape[-1]
        steps = d.uniforms.shape[0] if d.uniforms is not None else 1
        kernels.plain_advance_kernel[(d.batch,)](
            logits.contiguous(), token if token is not None else d.root, d.prefix, d.prefix32, d.root,
            d.n_out, d.done, d.limit, d.eos, d.out, d.counter, d.out.shape[1], steps - 1, V=vocab,
            GREEDY=token is None, BLOCK_V=kernels.block(vocab))


def make_bookkeeping(name: str, decoder):
    if name == "torch":
        return TorchBookkeeping(decoder)
    if name == "fused":
        return FusedBookkeeping(decoder)
    raise ValueError(f"bookkeeping must be one of {BOOKKEEPING}, got {name!r}")
