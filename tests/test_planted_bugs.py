"""Planted bugs: for every exercise, realistic student mistakes that its check must catch and name.

PLANTED is the one table of them. Each entry changes one piece of text of the exercise's
solution as a student might get it wrong (a `<` for `<=`, a missing rescale, a wrong index, a
bound off by one), loads the result as a student's file under `lessons/` (`mutant`), runs the
first of the check's cases whose name holds `case`, and requires the check to fail with a report
that names what the bug touches: the (query, key) pair, the key tile, the row, token, node or
partial, or, for a crash, the student's line.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from course.checks import run_cases
from course.core import runtime
from course.registry import EXERCISES, get

SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"

# In `names`, {line} is the number of the planted line in the student's file, {line+2} two below it
# (a crash on a later line than the planted one).
LINE = re.compile(r"\{line(?:\+(\d+))?\}")


@dataclass(frozen=True)
class Planted:
    exercise: str
    mistake: str  # the student's mistake, in a few words
    original: str  # text that occurs once in solutions/<file>.py
    planted: str  # what the student wrote instead
    case: str  # the check's first case whose name contains this is run
    names: tuple[str | re.Pattern, ...]  # what the report must contain
    absent: tuple[str, ...] = ()  # causes the report must not name: the exercise cannot have them here

    @property
    def module(self) -> str:
        """The solution module changed: the exercise's own."""
        return EXERCISES[self.exercise].module


PLANTED: tuple[Planted, ...] = (
    # ------------------------------------------------------------------ notebook 01: trees
    Planted("trees.dfs_times_kernel", "the root's start time never stored",
            "    start[b, 0] = 0\n", "\n", "two nodes",
            ("batch 0, node 0: start = -2147483648, expected 0", "never written")),
    Planted("trees.dfs_times_kernel", "the size sweep stops before node 1",
            "for i in range(n - 1, 0, -1):", "for i in range(n - 1, 1, -1):", "binary-ish",
            ("batch 0, node 0: end = 0, expected 14",)),
    Planted("trees.dfs_times_kernel", "a child's cursor starts at its own start time",
            "cursor[b, i] = start[b, i] + 1", "cursor[b, i] = start[b, i]", "binary-ish",
            ("batch 0, node 2: start = 1, expected 2",)),
    Planted("trees.dfs_times_kernel", "the end time off by one",
            "end[b, i] = start[b, i] + end[b, i] - 1", "end[b, i] = start[b, i] + end[b, i]", "two nodes",
            ("batch 0, node 0: end = 2, expected 1",)),
    Planted("trees.dfs_times_kernel", "the root's cursor never set",
            "    cursor[b, 0] = 1\n", "\n", "chain",
            ("31 start values were computed from cursor", "start was written"), ("never written",)),
    Planted("trees.tree_mask_kernel", "the ragged tile's bound past N",
            "if q < n and k < n:", "if q < n + 1 and k < n + 1:", "single node",
            ("at lessons/trees.py:{line+1} in tree_mask_kernel", "but start has shape (1, 1)")),
    Planted("trees.tree_mask_kernel", "a strict < in the start test",
            "mask[b, q, k] = start[b, k] <= start[b, q]", "mask[b, q, k] = start[b, k] < start[b, q]",
            "two nodes",
            ("the mask hid key 0 from query 0, but it is an ancestor-or-self",)),
    Planted("trees.tree_mask_kernel", "query and key swapped in the interval test",
            "mask[b, q, k] = start[b, k] <= start[b, q] and end[b, q] <= end[b, k]",
            "mask[b, q, k] = start[b, q] <= start[b, k] and end[b, k] <= end[b, q]", "two nodes",
            ("the mask let query 0 see key 1, which is not its ancestor",)),
    Planted("trees.tree_mask_kernel", "a key index that wraps at the 16-key tile",
            "mask[b, q, k] = start[b, k] <= start[b, q]",
            "mask[b, q, k] = start[b, k % 16 + k // 16 * n] <= start[b, q]", "chain N=32",
            ("at lessons/trees.py:{line}", "start[b, k % 16 + k // 16 * n] is start[0, ")),
    Planted("trees.tree_bitmask_kernel", "the word's last bit (63) never set",
            "for j in range(WORD_BITS):", "for j in range(WORD_BITS - 1):", "chain N=70",
            ("query 63, word 0", "bit 63 of that word is key 63: the mask hid key 63 from query 63")),
    Planted("trees.tree_bitmask_kernel", "the key of bit j ignores the word",
            "k = w * WORD_BITS + j", "k = j", "chain N=70",
            ("query 0, word 1", "bit 0 of that word is key 64: the mask let query 0 see key 64")),
    Planted("trees.tree_bitmask_kernel", "a strict < in the end test",
            "if k < n and start[b, k] <= start[b, q] and end[b, q] <= end[b, k]:",
            "if k < n and start[b, k] <= start[b, q] and end[b, q] < end[b, k]:", "two nodes",
            ("bit 0 of that word is key 0: the mask hid key 0 from query 0",)),
    # ------------------------------------------------------------------ notebook 02: attention
    Planted("attention.online_softmax", "the running sum not rescaled when the max rises",
            "l = l * torch.exp(m - m_new) + torch.exp", "l = l + torch.exp", "block=4",
            ("equals the stream with l never rescaled", "Row 0 goes wrong at block 1 (columns 4 onward)")),
    Planted("attention.online_softmax", "the loop stops one block early",
            "for first in range(0, x.shape[-1], block):\n        tile = x",
            "for first in range(0, x.shape[-1] - block, block):\n        tile = x", "block=16",
            ("block 2 (columns 32 onward) is never read",)),
    Planted("attention.online_softmax", "each block's slice one column short",
            "tile = x[..., first : first + block]", "tile = x[..., first : first + block - 1]", "block=4",
            ("without the last column of each block (columns 3, 7, ...)",)),
    # The same numbers computed whole: the check hands online_softmax x watched (course.core.blockread)
    Planted("attention.online_softmax", "the library's softmax instead of the stream",
            "    m = torch.full(x", "    return torch.softmax(x, dim=-1)\n    m = torch.full(x", "block=4",
            ("raised BlockReadError: online_softmax applied torch.softmax to x whole (all 37 columns)",
             "at lessons/attention.py:{line} in online_softmax",
             "column blocks x[..., first:first + block] of at most block = 4 columns")),
    Planted("attention.online_softmax", "the softmax of the whole row, exp(x) / sum",
            "    m = torch.full(x",
            "    return torch.exp(x) / torch.exp(x).sum(dim=-1, keepdim=True)\n    m = torch.full(x",
            "block=37",
            ("raised BlockReadError: online_softmax applied Tensor.sum to x whole (all 37 columns)",
             "at lessons/attention.py:{line} in online_softmax",
             "at most block = 37 columns")),
    Planted("attention.flash_attention", "the output accumulator not rescaled",
            "acc = acc * rescale.unsqueeze(-1) + p @ v[..., keys, :]", "acc = acc + p @ v[..., keys, :]",
            "random DFS-order tree N=29, block_k=7",
            ("the LSE is right, the output is wrong", "with the output accumulator never rescaled",
             "Row 7 goes wrong at key tile 1")),
    Planted("attention.flash_attention", "the LSE in log2",
            "return acc / l.unsqueeze(-1), m + torch.log(l)",
            "return acc / l.unsqueeze(-1), m + torch.log2(l)", "block_k=7",
            ("batch 1, row 14: lse = ", "the output is right, the LSE is wrong")),
    Planted("attention.flash_attention", "the key loop stops one tile early",
            "for first in range(0, k.shape[-2], block_k):",
            "for first in range(0, k.shape[-2] - block_k, block_k):", "random DFS-order tree N=29, block_k=7",
            ("it skips key tile 4 (keys 28 onward)",)),
    Planted("attention.flash_attention", "no shift for rows that have seen no key",
            "shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)", "shift = m_new",
            "anti-causal mask N=29 (early key tiles fully hidden), block_k=7",
            ("batch 0, row 7, column 0: out is NaN", "only in row 7 to 28",
             "sees no key in key tile 0 (row 7's first key is 7, in key tile 1)")),
    Planted("attention.merge_attention", "an empty part's NaN output not zeroed",
            "    out_a = torch.where(torch.isinf(lse_a).unsqueeze(-1), 0.0, out_a)\n", "", "first part empty",
            ("row 0, like every NaN row, has a part with lse = -inf",)),
    Planted("attention.merge_attention", "the LSEs added instead of log-added",
            "lse = torch.logaddexp(lse_a, lse_b)", "lse = lse_a + lse_b", "random split",
            ("row 5: lse = 7.52434, expected 4.46665", "row 0 is w_a out_a + w_b out_b")),
    Planted("attention.merge_attention", "weights relative to the first part's LSE",
            "weight_b = torch.exp(lse_b - safe)", "weight_b = torch.exp(lse_b - lse_a)", "random split",
            ("the LSE is right, the output is wrong",
             "row 0 is w_a out_a + w_b out_b with (w_a, w_b) = (0.501958, 0.992197)")),
    # ------------------------------------------------------------------ notebooks 03-11: the ladder
    Planted("ladder_k1.tree_attention_kernel", "a strict < in the start test",
            "if col < n and start[b, col] <= start[b, row]", "if col < n and start[b, col] < start[b, row]",
            "two nodes",
            ("the mask hid key 0 from query 0", "misses itself")),
    Planted("ladder_k1.tree_attention_kernel", "the normalised output not rescaled",
            "(alpha * l_prev * out[b, h, row, x] + pv) / l_new", "(l_prev * out[b, h, row, x] + pv) / l_new",
            "chain",
            ("with the output accumulator never rescaled", "goes wrong at key tile 1")),
    Planted("ladder_k1.tree_attention_kernel", "keys past N not skipped",
            "if col < n and start[b, col] <= start[b, row]", "if start[b, col] <= start[b, row]",
            "single node",
            ("at lessons/ladder_k1.py:{line}", "start[b, col] is start[0, 1]")),
    Planted("ladder_k1.tree_attention_kernel", "the running sum never written back",
            "                    row_sum[b, h, row] = l_new\n", "", "chain",
            ("equals attention over the keys of the last key tile where it sees a key only",
             "every NaN row checked (8) sees no key in the last key tile",
             "not carried from one key tile to the next"),
            ("skip", "descendants")),
    Planted("ladder_k2.tree_attention_kernel", "a strict < in the start test",
            "start[b, col] <= start[b, row] and end[b, row] <= end[b, col]",
            "start[b, col] < start[b, row] and end[b, row] <= end[b, col]", "two nodes",
            ("the output is attention under a wrong mask: the mask hid key 1 from query 1", "misses itself")),
    Planted("ladder_k2.tree_attention_kernel", "the output accumulator not rescaled",
            "acc[x] = alpha * acc[x] + pv", "acc[x] = acc[x] + pv", "chain",
            ("with the output accumulator never rescaled",
             re.compile(r"Row \d+ goes wrong at key tile 1, the first that raises its running max"))),
    Planted("ladder_k2.tree_attention_kernel", "the running sum not rescaled",
            "l_prev = alpha * l_prev + l_tile", "l_prev = l_prev + l_tile", "chain",
            ("with the running sum never rescaled",
             re.compile(r"Row \d+ goes wrong at key tile 1, the first that raises its running max"))),
    Planted("ladder_k2.tree_attention_kernel", "the ragged last key tile dropped",
            "    tiles = (n + TILE - 1) // TILE", "    tiles = n // TILE", "caterpillar",
            ("below key 64 only", "it skips key tile 2 (keys 64 onward)")),
    Planted("ladder_k2.tree_attention_kernel", "an off-by-one in the end test",
            "start[b, col] <= start[b, row] and end[b, row] <= end[b, col]",
            "start[b, col] <= start[b, row] and end[b, row] <= end[b, col] + 1", "random BFS",
            ("the mask with end[key] + 1 (an off-by-one)",
             re.compile(r"the mask let query \d+ see key \d+, which is not its ancestor"))),
    Planted("ladder_k2.tree_attention_kernel", "query and key swapped",
            "start[b, col] <= start[b, row] and end[b, row] <= end[b, col]",
            "start[b, row] <= start[b, col] and end[b, col] <= end[b, row]", "random DFS",
            ("the output is attention under the mask of descendants (query and key swapped)",)),
    Planted("ladder_k2.tree_attention_kernel", "the last row never stored",
            "    if row < n:\n        for x in range(D):", "    if row < n - 1:\n        for x in range(D):",
            "two nodes",
            ("row 1, column 0: out is NaN", "only in row 1", "never wrote")),
    Planted("ladder_k3.tree_attention_kernel", "a strict < in the start test",
            "if key_start[c] <= my_start and my_end <= key_end[c]:",
            "if key_start[c] < my_start and my_end <= key_end[c]:", "two nodes",
            ("the mask hid key 1 from query 1", "misses itself")),
    Planted("ladder_k3.tree_attention_kernel", "a row past N reads its times",
            "my_start = start[b, row] if row < n else NOBODY", "my_start = start[b, row]", "single node",
            ("at lessons/ladder_k3.py:{line}", "but start has shape (1, 1)")),
    Planted("ladder_k3.tree_attention_kernel", "the key bound off by one",
            "key_start[t] = start[b, key] if key < n else n",
            "key_start[t] = start[b, key] if key <= n else n", "single node",
            ("at lessons/ladder_k3.py:{line}", "start[b, key] is start[0, 1]")),
    Planted("ladder_k4.tree_attention_kernel", "a strict < in the start test",
            "if key_start[c] <= my_start and my_end <= key_end[c]:",
            "if key_start[c] < my_start and my_end <= key_end[c]:", "two nodes",
            ("the mask hid key 1 from query 1", "misses itself")),
    Planted("ladder_k4.tree_attention_kernel", "the query bound forgets the tile",
            "if i * TILE + r < n else ZERO", "if r < n else ZERO", "star",
            ("at lessons/ladder_k4.py:{line}", "q[b, h, i * TILE + r, x0 + t] is q[0, 0, 33,")),
    Planted("ladder_k4.tree_attention_kernel", "the key bound off by one",
            "k_tile[r, x0 + t] = k[b, h, key_r, x0 + t] if key_r < n else ZERO",
            "k_tile[r, x0 + t] = k[b, h, key_r, x0 + t] if key_r <= n else ZERO", "single node",
            ("at lessons/ladder_k4.py:{line}", "k[b, h, key_r, x0 + t] is k[0, 0, 1,")),
    Planted("ladder_k5.tree_attention_kernel", "a strict < in the start test",
            "if key_start[c] <= my_start and my_end <= key_end[c]:",
            "if key_start[c] < my_start and my_end <= key_end[c]:", "two nodes",
            ("the mask hid key 1 from query 1", "misses itself")),
    Planted("ladder_k5.tree_attention_kernel", "the bit loop misses the tile's last key",
            "            for c in range(TILE):\n                if key_start[c] <= my_start and my_end <= "
            "key_end[c]:",
            "            for c in range(TILE - 1):\n                if key_start[c] <= my_start and my_end "
            "<= key_end[c]:", "chain",
            ("the mask hid key 31 from query 31",)),
    Planted("ladder_k5.tree_attention_kernel", "the row's bits not reset to 0",
            "            visible = 0  # bit c: this row sees key c of the tile\n", "", "two nodes",
            ("raised UnboundLocalError", "at lessons/ladder_k5.py:{line+2}", "visible |= 1 << c")),
    Planted("ladder_k6.tree_attention_kernel", "the register accumulator not rescaled",
            "        for rr in range(ROWS):\n            alpha_r = row_scale[ROWS * ty + rr]\n            "
            "for cc in range(COLS):\n                acc[rr, cc] *= alpha_r\n", "", "chain",
            ("with the output accumulator never rescaled", "goes wrong at key tile 1")),
    Planted("ladder_k6.tree_attention_kernel", "the register accumulator not initialised",
            "    for rr in range(ROWS):\n        for cc in range(COLS):\n            acc[rr, cc] = ZERO\n",
            "", "two nodes",
            ("row 0, column 0: out is NaN", "an accumulator not initialised")),
    Planted("ladder_k6.tree_attention_kernel", "the output bound off by one",
            "        if out_row < n:", "        if out_row <= n:", "single node",
            ("at lessons/ladder_k6.py:{line+2}", "but out has shape (1, 1, 1, 32)")),
    Planted("ladder_k6.tree_attention_kernel", "each row divided by the sum of its thread's first row",
            "acc[rr, cc] / row_sum[ROWS * ty + rr]", "acc[rr, cc] / row_sum[ROWS * ty]", "two nodes",
            ("is the right output times a factor of its own", "divided by the wrong sum")),
    Planted("ladder_k7.tree_attention_kernel", "the coalesced store writes the first 32 columns only",
            "            for x0 in range(0, D, TILE):\n                out[b, h, out_row, x0 + t] = "
            "v_tile[r, x0 + t]",
            "            for x0 in range(0, TILE, TILE):\n                out[b, h, out_row, x0 + t] = "
            "v_tile[r, x0 + t]", "d=64",
            ("row 0, column 32: out is NaN", "only in column 32 to 63", "never wrote")),
    Planted("ladder_k7.tree_attention_kernel", "no barrier before reading the rows' sums",
            "    row_sum[t] = l_prev if row < n else ONE  # a row past N has no keys: keep 0/0 out of the "
            "tile\n    cuda.syncthreads()\n",
            "    row_sum[t] = l_prev if row < n else ONE  # a row past N has no keys: keep 0/0 out of the "
            "tile\n", "binary-ish",
            ("missing cuda.syncthreads()",)),
    Planted("ladder_k7.tree_attention_kernel", "the output bound off by one",
            "        if out_row < n:", "        if out_row <= n:", "single node",
            ("at lessons/ladder_k7.py:{line+2}", "but out has shape (1, 1, 1, 32)")),
    Planted("ladder_k8.tree_attention_kernel", "the score registers not reset per tile",
            "        for rr in range(ROWS):\n            for cc in range(KEYS):\n                s_reg[rr, "
            "cc] = ZERO\n", "", "two nodes",
            ("out is NaN", "an accumulator not initialised")),
    Planted("ladder_k8.tree_attention_kernel", "the scores not scaled by 1/sqrt(d)",
            "= s_reg[rr, cc] * SCALE", "= s_reg[rr, cc]", "binary-ish",
            ("the scores are not multiplied by 1/sqrt(d)",)),
    Planted("ladder_k8.tree_attention_kernel", "the key bound off by one",
            "k_t[x0 + t, r] = k[b, h, key_r, x0 + t] if key_r < n else ZERO",
            "k_t[x0 + t, r] = k[b, h, key_r, x0 + t] if key_r <= n else ZERO", "single node",
            ("at lessons/ladder_k8.py:{line}", "k[b, h, key_r, x0 + t] is k[0, 0, 1,")),
    Planted("ladder_k8.tree_attention_kernel", "the probabilities not masked (a tree of two nodes)",
            "p = math.exp(s_t[c, t] - m_new) if (visible >> c) & 1 else ZERO",
            "p = math.exp(s_t[c, t] - m_new)",
            "two nodes",
            ("the probabilities ignore the mask",
             "and over the padding keys past the end of the last key tile"),
            ("wrong sum", "skip")),
    Planted("ladder_k8.tree_attention_kernel", "the probabilities not masked (a chain)",
            "p = math.exp(s_t[c, t] - m_new) if (visible >> c) & 1 else ZERO",
            "p = math.exp(s_t[c, t] - m_new)",
            "chain",
            ("the probabilities ignore the mask", "row 0 sees 1 keys and takes 64"),
            ("the start test left out", "wrong sum", "skip")),
    Planted("ladder_k8.tree_attention_kernel", "the score tile stored untransposed",
            "s_t[tx + COL_STRIDE * cc, ROWS * ty + rr] = s_reg[rr, cc] * SCALE",
            "s_t[ROWS * ty + rr, tx + COL_STRIDE * cc] = s_reg[rr, cc] * SCALE", "two nodes",
            ("with the score tile of every (query tile, key tile) pair transposed",
             "row 1's score for key c of a key tile is that of row 0 + c against key 1 of the tile")),
    Planted("ladder_dense.tree_attention_kernel", "the mask read transposed",
            "mask[b, row, j * TILE + c]", "mask[b, j * TILE + c, row]", "binary-ish",
            ("the mask of descendants (query and key swapped)", "the mask let query 0 see key 1")),
    Planted("ladder_dense.tree_attention_kernel", "keys past N not skipped",
            "if row < n and j * TILE + c < n and mask", "if row < n and mask", "single node",
            ("at lessons/ladder_dense.py:{line}", "mask[b, row, j * TILE + c] is mask[0, 0, 1]")),
    Planted("ladder_dense.tree_attention_kernel", "rows past N not skipped",
            "if row < n and j * TILE + c < n and mask", "if j * TILE + c < n and mask", "single node",
            ("at lessons/ladder_dense.py:{line}", "but mask has shape (1, 1, 1)")),
    Planted("ladder_k9.tree_attention_kernel", "break where continue belongs",
            "        if not cuda.syncthreads_or(int32(visible != 0)):\n            continue",
            "        if not cuda.syncthreads_or(int32(visible != 0)):\n            break", "random BFS",
            ("it skips key tile 2 (keys 64 onward)",)),
    Planted("ladder_k9.tree_attention_kernel", "a strict < in the start test",
            "if key_start[c] <= my_start and my_end <= key_end[c]:",
            "if key_start[c] < my_start and my_end <= key_end[c]:", "two nodes",
            ("the mask hid key 1 from query 1", "misses itself")),
    Planted("ladder_k9.tree_attention_kernel", "keys past N read their times",
            "key_start[t] = start[b, key] if key < n else n", "key_start[t] = start[b, key]", "single node",
            ("at lessons/ladder_k9.py:{line}", "but start has shape (1, 1)")),
    Planted("ladder_k10.tile_visibility_kernel", "the result stored transposed",
            "tile_visible[b, i, j] = seen", "tile_visible[b, j, i] = seen", "chain",
            ("batch 0, query tile 0, key tile 1: tile_visible = 1, expected 0",)),
    Planted("ladder_k10.tile_visibility_kernel", "a strict < in the start test",
            "if key_start <= row_start[r] and row_end[r] <= key_end:",
            "if key_start < row_start[r] and row_end[r] <= key_end:", "star",
            ("batch 0, query tile 1, key tile 1: tile_visible = 0, expected 1",)),
    Planted("ladder_k10.tile_visibility_kernel", "the key bound off by one",
            "if key < n and seen == 0:", "if key <= n and seen == 0:", "star",
            ("at lessons/ladder_k10.py:{line+1} in tile_visibility_kernel", "start[b, key] is start[0, 33]")),
    Planted("ladder_k10.tree_attention_kernel", "break where continue belongs",
            "        if tile_visible[b, i, j] == 0:\n            continue",
            "        if tile_visible[b, i, j] == 0:\n            break", "random BFS",
            ("it skips key tile 2 (keys 64 onward)",)),
    Planted("ladder_k10.tree_attention_kernel", "the tile mask read transposed",
            "if tile_visible[b, i, j] == 0:", "if tile_visible[b, j, i] == 0:", "chain",
            ("without key tile 0 (keys 0 to 31), which row 32 sees",)),
    Planted("ladder_k10.tree_attention_kernel", "a strict < in the start test",
            "if key_start[c] <= my_start and my_end <= key_end[c]:",
            "if key_start[c] < my_start and my_end <= key_end[c]:", "two nodes",
            ("the mask hid key 1 from query 1", "misses itself")),
    Planted("ladder_k11.tree_attention_kernel", "query rows past N not clamped",
            "q[b, h, min(i * TILE + r0 + s, n - 1), x * TILE + t]",
            "q[b, h, i * TILE + r0 + s, x * TILE + t]", "single node",
            ("at lessons/ladder_k11.py:{line}", "q[b, h, i * TILE + r0 + s, x * TILE + t] is q[0, 0, 1,")),
    Planted("ladder_k11.tree_attention_kernel", "key rows past N not clamped",
            "key_r = min(j * TILE + r0 + s, n - 1)", "key_r = j * TILE + r0 + s", "single node",
            ("at lessons/ladder_k11.py:{line+2}", "k[b, h, key_r, x * TILE + t] is k[0, 0, 1,")),
    Planted("ladder_k11.tree_attention_kernel", "the query loads stop a stage early",
            "    for r0 in range(0, TILE, STAGE):\n        for s in range(STAGE):\n            for x in "
            "range(CHUNKS):",
            "    for r0 in range(0, TILE - STAGE, STAGE):\n        for s in range(STAGE):\n            for "
            "x in range(CHUNKS):", "binary-ish",
            ("row 16, column 0: out is NaN", "only in row 16 to 30")),
    Planted("ladder_k11.tree_attention_kernel", "the value tile filled from the keys' staging",
            "v_tile[r0 + s, x * TILE + t] = staged_v[s, x] if inside else ZERO",
            "v_tile[r0 + s, x * TILE + t] = staged_k[s, x] if inside else ZERO", "two nodes",
            ("equals attention over its visible keys where the value rows are the key rows",)),
    Planted("ladder_bug.tree_attention_kernel", "the missing barrier left out (the lesson as handed out)",
            "        cuda.syncthreads()  # every thread is done with this key tile before it is "
            "overwritten\n", "", "chain",
            ("two runs on the same input differ", "a race")),
    Planted("ladder_bug.tree_attention_kernel", "a memory fence where the barrier belongs",
            "        cuda.syncthreads()  # every thread is done with this key tile before it is "
            "overwritten\n",
            "        cuda.threadfence_block()  # every thread is done with this key tile before it is "
            "overwritten\n", "chain",
            ("two runs on the same input differ", "a race")),
    Planted("ladder_bug.tree_attention_kernel", "the barrier moved from after the loads, not added",
            "        key_end[t] = end[b, key] if key < n else NOBODY\n        cuda.syncthreads()\n",
            "        key_end[t] = end[b, key] if key < n else NOBODY\n", "chain",
            ("missing cuda.syncthreads()",)),
    # ------------------------------------------------------------------ notebook 12: Triton
    Planted("triton_attention.online_softmax_step", "a reduction over an axis the tile lacks",
            "    m_new = tl.maximum(m_i, tl.max(s, axis=1))",
            "    m_new = tl.maximum(m_i, tl.max(s, axis=2))", "two nodes",
            ("at lessons/triton_attention.py:{line} in online_softmax_step", "axis 2 out of bounds")),
    Planted("triton_attention.online_softmax_step", "the output accumulator not rescaled",
            "acc = acc * alpha[:, None] + tl.dot(", "acc = acc + tl.dot(", "random BFS",
            ("the LSE is right, the output is wrong", "with the output accumulator never rescaled",
             "goes wrong at key tile 1, the first that raises its running max")),
    Planted("triton_attention.online_softmax_step", "the running sum not rescaled",
            "l_i = l_i * alpha + tl.sum(p, axis=1)", "l_i = l_i + tl.sum(p, axis=1)", "random BFS",
            ("with the running sum never rescaled", "goes wrong at key tile 1")),
    Planted("triton_attention.online_softmax_step", "no shift for rows that have seen no key",
            "m_safe = tl.where(m_new == float(\"-inf\"), 0.0, m_new)", "m_safe = m_new", "root last",
            ("row 64, column 0: out is NaN", "(row 64's first key is 64, in key tile 1)")),
    Planted("triton_attention.tree_attention_kernel", "a strict < in the start test",
            "SOLUTION\n        sees = (key_start[None, :] <= row_start[:, None])",
            "SOLUTION\n        sees = (key_start[None, :] < row_start[:, None])", "two nodes",
            ("the mask hid key 0 from query 0", "misses itself")),
    Planted("triton_attention.tree_attention_kernel", "a strict < in the end test",
            "SOLUTION\n        sees = (key_start[None, :] <= row_start[:, None]) & (row_end[:, None] <= "
            "key_end[None, :])",
            "SOLUTION\n        sees = (key_start[None, :] <= row_start[:, None]) & (row_end[:, None] < "
            "key_end[None, :])", "random BFS",
            ("the mask hid key 0 from query 0",)),
    Planted("triton_attention.tree_attention_kernel", "an off-by-one in the start test",
            "SOLUTION\n        sees = (key_start[None, :] <= row_start[:, None])",
            "SOLUTION\n        sees = (key_start[None, :] <= row_start[:, None] + 1)", "binary-ish",
            ("the mask let query 1 see key 3, which is not its ancestor",)),
    Planted("triton_attention.tree_attention_kernel", "the output not divided by the running sum",
            "out = acc / l_safe[:, None]", "out = acc", "chain",
            ("the LSE is right, the output is wrong", "divided by the wrong sum")),
    Planted("triton_attention.tree_attention_kernel", "the LSE left in log2 units",
            "lse = (m_i + tl.math.log2(l_safe)) * LN2", "lse = m_i + tl.math.log2(l_safe)", "chain",
            ("the output is right, the LSE is wrong", "a log2 where log belongs")),
    # ------------------------------------------------------------------ notebooks 13-14: DeFT
    Planted("deft.reduce_partials_kernel", "the output accumulator not rescaled",
            "acc = acc * alpha[:, None] + w[:, None] * out_p", "acc = acc + w[:, None] * out_p",
            "up to 6 partials",
            ("query 0, head 1: equals the merge replayed with the output never rescaled",
             "its partial 1 (buffer row 29)")),
    Planted("deft.reduce_partials_kernel", "the running sum not rescaled",
            "        l = l * alpha + w\n", "        l = l + w\n", "up to 6 partials",
            ("the running sum never rescaled", "its partial 1 (buffer row 29)")),
    Planted("deft.reduce_partials_kernel", "the running max never updated",
            "        m = m_new\n        ### END SOLUTION", "        ### END SOLUTION", "up to 6 partials",
            ("the running max m never updated", "equals its last partial (buffer row 29)")),
    Planted("deft.reduce_partials_kernel", "the lse stored at the first query's rows",
            "tl.store(lse + where, m + tl.log(l), mask=real)",
            "tl.store(lse + heads, m + tl.log(l), mask=real)", "one partial per query",
            ("query 1, head 0: lse is NaN", "only in query 1 to 4")),
    Planted("deft.deft_node_kernel", "a row's query head ignores its KV head",
            "head = kv_head * GROUP + rows % GROUP", "head = kv_head + rows % GROUP", "a chain of nodes",
            ("partial 0, head 3: partial lse is NaN", "only in head 3",
             "partial 0 is query 0 in node group 0")),
    Planted("deft.deft_node_kernel", "a row's member ignores its tile",
            "member = tile * QUERIES_PER_TILE + rows // GROUP", "member = tile + rows // GROUP",
            "nodes of one token",
            ("partial 10, head 0: partial lse is NaN", "partial 10 is query 10 in node group 0")),
    Planted("deft.deft_node_kernel", "the partial's number forgets the group's first",
            "position = (first + member).to(tl.int64)", "position = member.to(tl.int64)", "a chain of nodes",
            ("partial 2, head 0: partial lse is NaN", "partial 2 is query 0 in node group 1")),
    Planted("deft.deft_node_kernel", "rows past the group's queries not masked",
            "valid = (rows < QUERIES_PER_TILE * GROUP) & (member < count)",
            "valid = rows < QUERIES_PER_TILE * GROUP", "a single node",
            ("at lessons/deft.py:{line+1} in tile_rows", "raised OutOfBoundsAccess: tl.load out of bounds",
             "elements 2 to 31 of member_query, which spans elements 0 to 1")),
    Planted("deft.deft_node_kernel", "the partial's lse stored without the row mask",
            "tl.store(lse_part + position * HEADS_Q + head, lse, mask=valid)",
            "tl.store(lse_part + position * HEADS_Q + head, lse)", "a single node",
            ("at lessons/deft.py:{line} in store_partials",
             "raised OutOfBoundsAccess: tl.store out of bounds", "of lse_part, which spans elements 0 to 3",
             "nothing was written")),
    Planted("deft.deft_flatten_kernel", "the row's bit not taken modulo 64",
            "<< (member % 64).to(tl.int64)", "<< member.to(tl.int64)", "more than 64 queries",
            ("partial 64, head 0: partial lse = -inf, expected", "partial 64 is query 64 in block group 0")),
    Planted("deft.deft_flatten_kernel", "every row reads bitmask word 0",
            "bits = tl.load(token_words + tokens.to(tl.int64) * num_words + word, mask=inside, other=0)",
            "bits = tl.load(token_words + tokens.to(tl.int64) * num_words, mask=inside, other=0)",
            "more than 64 queries",
            ("partial 65 is query 65 in block group 0",)),
    Planted("deft.deft_flatten_kernel", "the token's word read at its place in the block",
            "bits = tl.load(token_words + tokens.to(tl.int64) * num_words + word, mask=inside, other=0)",
            "bits = tl.load(token_words + (tokens - token_start).to(tl.int64) * num_words + word, "
            "mask=inside, other=0)", "nodes of one token",
            ("partial 34 is query 10 in block group 1, tokens [32, 64)",)),
    Planted("deft.deft_flatten_kernel", "the row's bit tested on the wrong axis",
            "visible = ((bits[None, :] & row_bit[:, None]) != 0) & inside[None, :]",
            "visible = ((bits[:, None] & row_bit[None, :]) != 0) & inside[None, :]", "nodes of one token",
            ("partial 26 is query 2 in block group 1",)),
    # ------------------------------------------------------------------ notebook 15: sampling
    Planted("spec_sampling.tile_pass_kernel", "accepting with <= instead of <",
            "test = r.to(tl.float64) * q_x.to(tl.float64) < p_x.to(tl.float64)",
            "test = r.to(tl.float64) * q_x.to(tl.float64) <= p_x.to(tl.float64)", "ties",
            ("batch 2, position 0: accept = True, expected False (r * q(x) = 0.375, p(x) = 0.375, "
             "token 20)",)),
    Planted("spec_sampling.tile_pass_kernel", "the test in float32",
            "test = r.to(tl.float64) * q_x.to(tl.float64) < p_x.to(tl.float64)", "test = r * q_x < p_x",
            "float32 resolution",
            ("batch 0, position 0: accept = False, expected True",)),
    Planted("spec_sampling.tile_pass_kernel", "the residual not clamped at 0",
            "    a = tl.maximum(f, 0.0)\n", "    a = f\n", "gamma = 1",
            ("batch 1, position 0, tile 0: residual_sums = -0.00250459, expected 0.37786",)),
    Planted("spec_sampling.first_crossing", "the crossing found with >= instead of >",
            "crossed = (cumulative > threshold) & positive", "crossed = (cumulative >= threshold) & positive",
            "ties",
            ("sample 0, position 1: drew token 3 where pyspec_ref draws 36 (u = 0.5)",)),
    Planted("spec_sampling.first_crossing", "the offset includes the crossing weight",
            "before = tl.sum(tl.where(positions == j, cumulative - weights, 0.0), axis=0)",
            "before = tl.sum(tl.where(positions == j, cumulative, 0.0), axis=0)", "gamma = 1",
            ("sample 0, position 1: drew token 0 where pyspec_ref draws 30",)),
    Planted("spec_sampling.first_crossing", "an empty residual drawn from, not p",
            "sums = tl.where(empty, tl.load(target_sums + row * T + ks, mask=ks < T, other=0.0), residual)",
            "sums = residual", "empty residual",
            ("sample 0, position 0: drew -1, not a token id in [0, 37)",)),
    Planted("spec_sampling.first_crossing", "the token searched from offset 0, not the tiles before",
            "j, _ = first_crossing(weights, before, threshold, TILE)",
            "j, _ = first_crossing(weights, 0.0, threshold, TILE)", "random B=4",
            ("drew token 56 where pyspec_ref draws 43", "beyond float32 rounding")),
    Planted("spec_sampling.first_crossing", "the offset of earlier tiles left out",
            "cumulative = offset + tl.cumsum(weights, axis=0)", "cumulative = tl.cumsum(weights, axis=0)",
            "first rejected",
            ("sample 1, position 0: drew token 36 where pyspec_ref draws 32",)),
    # ------------------------------------------------------------------ notebook 16: verification
    Planted("tree_verification.tree_walk_kernel", "accepting with <= instead of <",
            "accept = r * q_x * z < s * tl.maximum(p_x - c * q_x, 0.0)",
            "accept = r * q_x * z <= s * tl.maximum(p_x - c * q_x, 0.0)", "r q(x) = p(x) exactly",
            ("at node 0 the kernel went on to node 1, the specification would stop and draw",
             "r = 0.5, q(x) = 0.125, p(x) = 0.0625")),
    Planted("tree_verification.tree_walk_kernel", "the residual's normalisation forgotten",
            "accept = r * q_x * z < s * tl.maximum(p_x - c * q_x, 0.0)",
            "accept = r * q_x < s * tl.maximum(p_x - c * q_x, 0.0)", "renormalised residual",
            ("at node 0 the kernel stopped, the specification would go on to node 2",
             "the test leaves out Z, the residual's normalisation")),
    Planted("tree_verification.tree_walk_kernel", "the residual kept after an accepted child",
            "                c = tl.zeros_like(c)\n                z = tl.zeros_like(z) + 1.0\n"
            "                s = tl.zeros_like(s) + 1.0\n", "",
            "renormalised residual",
            ("same path, but next token 26 instead of 27 (the draw at node 2)",
             "the state (C, Z, S) is not reset after an accepted child")),
    Planted("tree_verification.tree_walk_kernel", "S never decremented",
            "                    s = tl.where(keep, tl.where(c == 0.0, q_mass, s) - q_x, s)\n",
            "                    pass\n", "star N=4 without replacement",
            ("S (the draft mass not yet drawn) is never decremented",)),
    Planted("tree_verification.tree_walk_kernel", "S decremented with replacement too",
            "                if not REPLACEMENT:\n", "                if True:\n",
            "star N=4 with replacement",
            ("S is decremented although the children were drawn with replacement",)),
    Planted("tree_verification.tree_walk_kernel", "S after the first draw taken as 1 - q(x), not Q - q(x)",
            "tl.where(c == 0.0, q_mass, s) - q_x", "s - q_x", "star N=4 without replacement",
            ("S after the first rejection is taken as 1 - q(x)",)),
    Planted("tree_verification.tree_walk_kernel", "C advanced by Z instead of Z / S",
            "c_next = c + z / s", "c_next = c + z", "star N=4 without replacement",
            ("C is advanced by Z instead of Z / S",)),
    Planted("tree_verification.tree_walk_kernel", "the test without S",
            "accept = r * q_x * z < s * tl.maximum(p_x - c * q_x, 0.0)",
            "accept = r * q_x * z < tl.maximum(p_x - c * q_x, 0.0)", "star N=4 without replacement",
            ("the test leaves out S",)),
    Planted("tree_verification.greedy_walk_kernel", "the depth advanced even where no child matches",
            "depth += going.to(tl.int32)", "depth += 1", "random trees N=12, V=",
            ("at node 0 the walk must stop", "path[1] = -2147483648")),
    Planted("tree_verification.greedy_walk_kernel", "the last matching child taken, not the first",
            "match = tl.min(tl.where((par == node) & (tok == wanted), ids, BLOCK_N), axis=0)\n        going "
            "= match < BLOCK_N",
            "match = tl.max(tl.where((par == node) & (tok == wanted), ids, -1), axis=0)\n        going = "
            "match >= 0", "two children with the argmax",
            ("at node 0 path[1] = 5, but the walk goes on to node 3",
             "ties go to the child with the smallest id")),
    Planted("tree_verification.greedy_walk_kernel", "the depth advanced after the store",
            "        depth += going.to(tl.int32)\n        tl.store(path + b * N + depth, match, "
            "mask=going)\n",
            "        tl.store(path + b * N + depth, match, mask=going)\n        depth += "
            "going.to(tl.int32)\n", "whole chain",
            ("path[0] = 1, but every path starts at the root, node 0",)),
    # ------------------------------------------------------------------ notebook 17: EMS-SD
    Planted("emssd.unpadded_attention_kernel", "the search's test with < instead of <=",
            "go_right = tl.load(offsets + mid) <= t", "go_right = tl.load(offsets + mid) < t",
            "a sample with 0 new tokens",
            ("token 4 (new token 0 of sample 2) must see KV rows 28 to 37",
             "every wrong token (4) is the first new token of its sample")),
    Planted("emssd.unpadded_attention_kernel", "the midpoint rounded down",
            "mid = (lo + hi + 1) // 2", "mid = (lo + hi) // 2", "very different lengths",
            ("token 10 (new token 0 of sample 2) must see KV rows 3 to 6",)),
    Planted("emssd.unpadded_attention_kernel", "the midpoint rounded down (a sample with no new token)",
            "mid = (lo + hi + 1) // 2", "mid = (lo + hi) // 2", "a sample with 0 new tokens",
            ("token 4 (new token 0 of sample 2) must see KV rows 28 to 37",), ("skip", "key tile")),
    Planted("emssd.unpadded_attention_kernel", "the sample's keys without its new ones",
            "width = kv_len + count", "width = kv_len", "one sample",
            ("token 0 (new token 0 of sample 0) must see KV rows 3 to 23",)),
    Planted("emssd.unpadded_attention_kernel", "a token does not see itself",
            "visible = mine[:, None] & (cols_kv[None, :] <= kv_len + position[:, None])",
            "visible = mine[:, None] & (cols_kv[None, :] < kv_len + position[:, None])", "one sample",
            ("the kernel hid KV row 23 (new token 0 of sample 0) from token 0 (new token 0 of sample 0)",)),
    # ------------------------------------------------------------------ notebook 18: SwiftSpec
    Planted("swiftspec.compact_kernel", "every sample reads the first sample's moves",
            "s = tl.load(src + b * stride_moves + moves, mask=live, other=0).to(tl.int64)",
            "s = tl.load(src + moves, mask=live, other=0).to(tl.int64)", "random trees",
            ("sample 1, stacked row 0, slot 5: holds the row of old slot 8, expected the row of old "
             "slot 7",)),
    Planted("swiftspec.compact_kernel", "rows moved the wrong way (dst to src)",
            "rows = tl.load(base + s[:, None] * stride_c", "rows = tl.load(base + t[:, None] * stride_c",
            "overlap",
            ("sample 0, stacked row 0, slot 6: holds the row of old slot 6, expected the row of old slot 7 "
             "(moved 7 -> 6)",)),
    Planted("swiftspec.compact_kernel", "the store not masked to the live moves",
            "tl.store(base + t[:, None] * stride_c + cols[None, :] * stride_d, rows, mask=mask)",
            "tl.store(base + t[:, None] * stride_c + cols[None, :] * stride_d, rows)", "random trees",
            ("sample 0, stacked row 0, slot 0: holds a row that was nowhere in the old cache",)),
    Planted("swiftspec.compact_kernel", "the row and column strides swapped",
            "rows = tl.load(base + s[:, None] * stride_c + cols[None, :] * stride_d, mask=mask)",
            "rows = tl.load(base + s[:, None] * stride_d + cols[None, :] * stride_c, mask=mask)",
            "random trees",
            ("sample 0, stacked row 0, slot 2: holds a row that was nowhere in the old cache",
             "expected the row of old slot 8 (moved 8 -> 2)")),
    Planted("swiftspec.tree_cache_attention_kernel", "padding queries counted as real",
            "valid = (packed < GROUP * W) & (w < count)", "valid = packed < GROUP * W", "padding",
            ("sample 0, head 0, query 3: lse = 3.496, expected -inf",)),
    Planted("swiftspec.tree_cache_attention_kernel", "a strict < in the start test",
            "ancestor = (ks[None, :] <= qs[:, None])", "ancestor = (ks[None, :] < qs[:, None])",
            "random trees",
            ("the kernel hid cache row 52 (node 31, [start, end] = [31, 35]) from query 0 (node 31, "
             "[start, end] = [31, 35]), but it is an ancestor-or-self",)),
    Planted("swiftspec.tree_cache_attention_kernel", "the end test left out",
            "ancestor = (ks[None, :] <= qs[:, None]) & (qe[:, None] <= ke[None, :])",
            "ancestor = ks[None, :] <= qs[:, None]", "random trees",
            ("the end test left out",
             "the kernel let query 0 (node 16, [start, end] = [4, 4]) see cache row 13 (node 15, [start, "
             "end] = [3, 3]), which is not its ancestor")),
    Planted("swiftspec.tree_cache_attention_kernel", "query and row swapped in the interval test",
            "ancestor = (ks[None, :] <= qs[:, None]) & (qe[:, None] <= ke[None, :])",
            "ancestor = (qs[:, None] <= ks[None, :]) & (ke[None, :] <= qe[:, None])", "random trees",
            ("the mask of descendants (query and key swapped)",
             "the kernel hid cache row 21 (node 0, [start, end] = [0, 35]) from query 0 (node 31")),
    # ------------------------------------------------------------------ notebook 21: sibling draws
    Planted("tree_shape.sibling_draw_kernel", "a drawn token left among the keys",
            'keys = tl.where(offs == best, float("-inf"), keys)', "keys = tl.where(offs == best, keys, keys)",
            "peaked", ("node 0: siblings", "drawn twice", "must leave the keys")),
    Planted("tree_shape.sibling_draw_kernel", "no Gumbel noise (the top-k of q)",
            "log_q - tl.log(-tl.log(tl.maximum(u, TINY)))", "log_q + 0.0 * u", "spread",
            ("node 0: siblings", "most likely tokens", "Gumbel noise")),
    Planted("tree_shape.sibling_draw_kernel", "log u as the noise",
            "log_q - tl.log(-tl.log(tl.maximum(u, TINY)))", "log_q + tl.log(tl.maximum(u, TINY))", "V=200",
            ("node 0: siblings", "the keys must be log q(v) - log(-log u_v)")),
    Planted("tree_shape.sibling_draw_kernel", "log q not normalised (the max subtracted, no log-sum)",
            "log_q = x - (top + tl.log(tl.sum(tl.where(live, tl.exp(x - top), 0.0), axis=0)))",
            "log_q = x - top", "spread",
            ("node 0, sibling 0 (token 1): log q", "log-softmax at the drawn token")),
    Planted("tree_shape.sibling_draw_kernel", "the key stored as log q",
            "tl.sum(tl.where(offs == best, log_q, 0.0), axis=0)", "tl.max(keys, axis=0)", "spread",
            ("node 0, sibling 0", "log-softmax at the drawn token")),
)


def mutant(tmp_path, module: str, original: str, planted: str):
    """solutions/<module>.py with one piece of text changed, imported from tmp_path/lessons/<module>.py
    (a student's file, as the checks name it); returns (the module, the line where the change starts)."""
    source = (SOLUTIONS / f"{module}.py").read_text()
    assert source.count(original) == 1, f"{original!r} must occur once in solutions/{module}.py"
    folder = tmp_path / "lessons"
    folder.mkdir(exist_ok=True)
    path = folder / f"{module}.py"
    path.write_text(source.replace(original, planted))
    # Named inside the solutions package, so that its relative imports (`from .triton_attention
    # import ...`) find the other solution modules, as a lesson's find the other lessons.
    name = f"solutions.mutant_{module}_{tmp_path.name}"
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded  # a dataclass in the module looks its module up there
    spec.loader.exec_module(loaded)
    line = source[:source.index(original)].count("\n") + 1
    return loaded, line


def planted(exercise: str, mistake: str) -> Planted:
    """The entry of PLANTED for this exercise and mistake."""
    return next(bug for bug in PLANTED if (bug.exercise, bug.mistake) == (exercise, mistake))


def report_of(bug: Planted, tmp_path) -> tuple[str, int]:
    """The check's report on the first matching case of the planted module, and the planted line."""
    module, line = mutant(tmp_path, bug.module, bug.original, bug.planted)
    cases = ((name, run) for name, run in get(bug.exercise).cases(module, 0) if bug.case in name)
    report = run_cases(bug.exercise, itertools.islice(cases, 1))
    assert report.results, f"no case of {bug.exercise} has {bug.case!r} in its name"
    assert not report.passed and not report.not_implemented, report.text()
    return report.text(), line


def expected_in(name: str | re.Pattern, text: str, line: int) -> bool:
    """Whether the report says `name`, with {line} (or {line+2}) the planted line's number (plus 2)."""
    def number(match: re.Match) -> str:
        return str(line + int(match.group(1) or 0))

    if isinstance(name, re.Pattern):
        return re.search(LINE.sub(number, name.pattern), text) is not None
    return LINE.sub(number, name) in text


# The cases named in the table, their sizes and tiles are the simulator's (course.core.runtime.pick), and
# many of the mistakes show only there: an out-of-bounds access raises, shared and local memory start
# as NaN, threads interleave. The checks' diagnoses are the same code on a GPU.
@pytest.mark.skipif(not runtime.SIMULATOR, reason="the planted bugs are calibrated on the simulator's cases")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a wrong kernel divides 0 by 0 on its way to a NaN
@pytest.mark.parametrize("bug", PLANTED, ids=lambda bug: f"{bug.exercise}: {bug.mistake}")
def test_the_check_catches_the_planted_bug_and_names_its_place(bug, tmp_path):
    text, line = report_of(bug, tmp_path)
    for name in bug.names:
        assert expected_in(name, text, line), f"the report does not say {name!r}:\n{text}"
    for cause in bug.absent:
        assert cause not in text, f"the report names {cause!r}, which this bug is not:\n{text}"


def test_every_exercise_has_three_planted_bugs():
    counts = Counter(bug.exercise for bug in PLANTED)
    assert set(counts) <= set(EXERCISES), set(counts) - set(EXERCISES)
    assert {e: counts[e] for e in EXERCISES if counts[e] < 3} == {}
    # a bug the report need not name proves nothing
    assert all(isinstance(bug.names, tuple) and bug.names for bug in PLANTED)
