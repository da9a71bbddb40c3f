"""Checks for notebook 02: the online softmax, tiled (flash) attention and the log-sum-exp merge.

These exercises are about the algorithm, so they run in float64 and must match
pyspec_ref to rounding: a forgotten rescale or a NaN from a fully hidden tile
shows up as a large error, not as noise.
"""

from __future__ import annotations

import math
import random

import torch

import pyspec_ref
from course import oracle
from course.checks import CaseResult
from course.checks.diagnose import compare_floats, compare_out_and_lse, first_index
from course.checks.diagnose_attention import EVERY_CAUSE, SKIP_TEST, TILE_LAYOUT, explain_attention
from course.core import blockread, inputs

ATOL, RTOL = 1e-9, 1e-7
# flash_attention loops over key blocks of a tensor: it skips none, and has no shared tiles to lay out.
CAUSES = EVERY_CAUSE - {SKIP_TEST, TILE_LAYOUT}
EXAMINED_ROWS = 5


def _reference_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor([pyspec_ref.softmax(row) for row in x.tolist()], dtype=torch.float64)


def check_online_softmax(module, seed: int):
    """online_softmax(x, block) must equal pyspec_ref.softmax for every block size, and compute its
    running max and sum from column blocks of at most `block` columns: it gets x watched
    (course.core.blockread), and a reduction over x whole (torch.softmax, x.max(dim=-1)) fails the case."""
    rows, cols = 5, 37
    for block in (1, 4, 16, cols, cols + 5):
        for label, offset in (("", 0.0), (", large scores", 900.0)):
            name = f"{rows}x{cols} scores, block={block}{label}"

            def run(name=name, block=block, offset=offset):
                drawn = inputs.case_seed(seed, name)
                x = inputs.random_tensor((rows, cols), drawn, torch.float64) * 3 + offset
                got = blockread.plain(module.online_softmax(blockread.watched(x, block, "online_softmax"),
                                                            block))
                problem = compare_floats(got, _reference_softmax(x), "p", ("row", "column"),
                                         ATOL, RTOL)
                if problem:
                    why = explain_softmax(got, x, block)
                    problem += f"\n{why}" if why else ""
                return CaseResult(name, False, problem) if problem else None
            yield name, run


def _streamed_softmax(x: torch.Tensor, block: int, read: torch.Tensor, rescale: bool) -> torch.Tensor:
    """One row's softmax computed as online_softmax does, in float64, from the columns where `read`
    is True only, with or without the rescale of the running sum: exp(x - m) / l for every column."""
    m, l = float("-inf"), 0.0
    for first in range(0, x.shape[0], block):
        tile = x[first:first + block][read[first:first + block]]
        if not len(tile):
            continue
        m_new = max(m, float(tile.max()))
        l = (l * math.exp(m - m_new) if rescale else l) + float(torch.exp(tile - m_new).sum())
        m = m_new
    return torch.exp(x - m) / l


def explain_softmax(got: torch.Tensor, x: torch.Tensor, block: int) -> str:
    """Why a streamed softmax is wrong: '' if no story fits the failing rows, else which.

    A row whose every p is off by one common factor has the right exponentials and a wrong running
    sum l; replays of the stream (Milakov & Gimelshein 2018) then say how the sum went wrong: not
    rescaled when a block raised the max (naming that block), blocks left unread at the end, or
    each block's slice one column short.
    """
    got, x = got.detach().cpu().double(), x.detach().cpu().double()
    want = torch.softmax(x, dim=-1)
    failing = ((got - want).abs() > ATOL + RTOL * want.abs()).any(-1) & got.isfinite().all(-1)
    rows = [int(r) for r in torch.nonzero(failing).flatten()[:EXAMINED_ROWS]]
    if not rows or not all(_is_multiple(got[r], want[r]) for r in rows):
        return ""
    columns = torch.arange(x.shape[-1])
    everything = torch.ones(x.shape[-1], dtype=torch.bool)
    r = rows[0]

    def all_rows(read, rescale=True) -> bool:
        return all(torch.allclose(got[i], _streamed_softmax(x[i], block, read, rescale), rtol=1e-6,
                                  atol=1e-12) for i in rows)

    common = "the exponentials are right and the running sum l is wrong"
    if all_rows(everything, rescale=False):
        raised = _first_raise(x[r], block)
        return (f"{common}: every failing row checked ({len(rows)}) equals the stream with l never rescaled "
                f"by exp(m_old - m_new) (missing rescale?). Row {r} goes wrong at block {raised} (columns "
                f"{raised * block} onward), the first that raises its running max")
    for stop in range(block * ((x.shape[-1] - 1) // block), 0, -block):
        if all_rows(columns < stop):
            return (f"{common}: every failing row checked ({len(rows)}) equals the stream over columns below "
                    f"{stop} only: block {stop // block} (columns {stop} onward) is never read (a loop bound "
                    "off by one?)")
    if block > 1 and all_rows(columns % block != block - 1):
        return (f"{common}: every failing row checked ({len(rows)}) equals the stream without the last "
                f"column of each block (columns {block - 1}, {2 * block - 1}, ...): a slice one column "
                "short?")
    factor = float(got[r] @ want[r]) / float(want[r] @ want[r])
    return f"{common}: in row {r} every p is the right value times {factor:.6g}"


def _is_multiple(got_row: torch.Tensor, want_row: torch.Tensor) -> bool:
    """got_row = c want_row for one c (not 1), to rounding."""
    factor = float(got_row @ want_row) / float(want_row @ want_row)
    return abs(factor - 1) > 1e-6 and bool(torch.allclose(got_row, factor * want_row, rtol=1e-6, atol=1e-12))


def _first_raise(row: torch.Tensor, block: int) -> int:
    """The first block after block 0 whose max exceeds the running max of the blocks before it."""
    running = float(row[:block].max())
    for first in range(block, row.shape[0], block):
        tile_max = float(row[first:first + block].max())
        if tile_max > running:
            return first // block
        running = max(running, tile_max)
    return 0


def _attention_masks():
    """(label, N, draw) of the masks to attend with: tree masks, one whose first tiles are hidden,
    and a random tree's; draw(rng) gives the mask's rows (a random one from the case's own rng)."""
    for case in inputs.edge_case_trees(8)[2:7]:
        mask = pyspec_ref.tree_mask(list(case.parents))
        yield f"tree mask of {case.name}", case.n, lambda rng, mask=mask: mask
    n = 29
    yield f"anti-causal mask N={n} (early key tiles fully hidden)", n, lambda rng: [
        [k >= q for k in range(n)] for q in range(n)]
    yield (f"tree mask, random DFS-order tree N={n}", n,
           lambda rng: pyspec_ref.tree_mask(inputs.random_tree(n, rng, order="dfs")))


def _reference_attention(q, k, v, mask):
    outs, lses = [], []
    for b in range(q.shape[0]):
        out, lse = pyspec_ref.attention_with_lse(q[b].tolist(), k[b].tolist(), v[b].tolist(),
                                                 mask)
        outs.append(out)
        lses.append(lse)
    return torch.tensor(outs, dtype=torch.float64), torch.tensor(lses, dtype=torch.float64)


def check_flash_attention(module, seed: int):
    """flash_attention(q, k, v, mask, block_k) must return pyspec_ref's (out, lse)."""
    for label, n, draw in _attention_masks():
        for block_k in sorted({1, 7, 16, n + 3}):
            name = f"{label}, block_k={block_k}"

            def run(name=name, draw=draw, block_k=block_k, n=n):
                drawn = inputs.case_seed(seed, name)
                mask_rows = draw(random.Random(drawn))
                q, k, v = (inputs.random_tensor((2, n, 8), drawn + 1 + j, torch.float64) for j in range(3))
                mask = torch.tensor(mask_rows).expand(2, n, n)
                out, lse = module.flash_attention(q, k, v, mask, block_k=block_k)
                want_out, want_lse = _reference_attention(q, k, v, mask_rows)
                problem = compare_out_and_lse(out, want_out, lse, want_lse, ("batch", "row", "column"),
                                              ("batch", "row"), (ATOL, RTOL), (ATOL, RTOL))
                if problem:
                    why = explain_attention(out, q, k, v, mask, block_k, ATOL, RTOL, causes=CAUSES)
                    problem += f"\n{why}" if why else ""
                return CaseResult(name, False, problem) if problem else None
            yield name, run


def _split_partials(q, k, v, part_of_key):
    """Partial (out, lse) of each query row over the keys of part 0 and of part 1.

    A part with no key gets lse = -inf and an out of NaN (0/0), which the merge must ignore.
    """
    parts = []
    for part in (0, 1):
        keys = [j for j, p in enumerate(part_of_key) if p == part]
        if not keys:
            empty_out = torch.full((q.shape[0], v.shape[1]), float("nan"), dtype=torch.float64)
            parts.append((empty_out, torch.full((q.shape[0],), float("-inf"), dtype=torch.float64)))
            continue
        out, lse = oracle.attention_with_lse(q, k[keys], v[keys])
        parts.append((out, lse))
    return parts


def check_merge_attention(module, seed: int):
    """merge_attention of partials over two disjoint key sets must equal attention over all keys."""
    n_query, n_key, d = 6, 23, 8
    splits = {  # which part each key goes to, drawn from the case's own rng
        "random split of the keys": lambda rng: [rng.randrange(2) for _ in range(n_key)],
        "first part empty (lse = -inf)": lambda rng: [1] * n_key,
        "second part empty (lse = -inf)": lambda rng: [0] * n_key,
        "one key in the first part": lambda rng: [0] + [1] * (n_key - 1),
    }
    for name, split in splits.items():
        def run(name=name, split=split):
            drawn = inputs.case_seed(seed, name)
            part_of_key = split(random.Random(drawn))
            q, k, v = (inputs.random_tensor(shape, drawn + 1 + j, torch.float64)
                       for j, shape in enumerate([(n_query, d), (n_key, d), (n_key, d)]))
            (out_a, lse_a), (out_b, lse_b) = _split_partials(q, k, v, part_of_key)
            out, lse = module.merge_attention(out_a, lse_a, out_b, lse_b)
            want = [pyspec_ref.merge_attention([out_a[i].tolist(), out_b[i].tolist()],
                                               [float(lse_a[i]), float(lse_b[i])])
                    for i in range(n_query)]
            want_out = torch.tensor([w[0] for w in want], dtype=torch.float64)
            want_lse = torch.tensor([w[1] for w in want], dtype=torch.float64)
            problem = compare_out_and_lse(out, want_out, lse, want_lse, ("row", "column"), ("row",),
                                          (ATOL, RTOL), (ATOL, RTOL))
            if problem:
                why = explain_merge(out, (out_a, out_b), (lse_a, lse_b), want_lse)
                problem += f"\n{why}" if why else ""
            return CaseResult(name, False, problem) if problem else None
        yield name, run


def explain_merge(out: torch.Tensor, parts, part_lses, want_lse: torch.Tensor) -> str:
    """Why a merge is wrong: NaN from a part that saw no key, or the weights the kernel used.

    A merged row is w_a out_a + w_b out_b with w = exp(lse_part - lse); a row that is a combination
    of its parts' outputs gets its weights fitted (least squares) and set beside the right ones.
    """
    out = out.detach().cpu().double()
    nan = out.isnan().any(-1)
    if nan.any():
        empty = torch.stack([torch.isinf(lse.cpu()) for lse in part_lses]).any(0)
        if bool(empty[nan].all()):
            row = first_index(nan)[0]
            return (f"row {row}, like every NaN row, has a part with lse = -inf: a part that saw no key, "
                    "whose out is NaN (0/0). Its weight exp(-inf) is 0, but 0 * NaN is NaN: zero that "
                    "part's out before weighting it")
        return ""
    wrong = ((out - _merged(parts, part_lses, want_lse)).abs() > ATOL + RTOL * out.abs()).any(-1)
    if not wrong.any():  # the output is right: only the LSE is wrong, and compare_out_and_lse says so
        return ""
    row = first_index(wrong)[0]
    columns = torch.stack([part[row].detach().cpu().double() for part in parts], dim=1)  # (d, 2)
    if not bool(columns.isfinite().all()):
        return ""
    weights = torch.linalg.lstsq(columns, out[row].unsqueeze(-1)).solution.flatten()
    if not torch.allclose(columns @ weights, out[row], rtol=1e-6, atol=1e-9):
        return ""
    right = [float(torch.exp(lse[row].double() - want_lse[row])) for lse in part_lses]
    fitted = ", ".join(f"{float(w):.6g}" for w in weights)
    return (f"row {row} is w_a out_a + w_b out_b with (w_a, w_b) = ({fitted}); the merge weights are "
            f"w = exp(lse_part - lse) = ({right[0]:.6g}, {right[1]:.6g}), which sum to 1 (lse the merged "
            "log-sum-exp)")


def _merged(parts, part_lses, lse: torch.Tensor) -> torch.Tensor:
    """The right merge of two parts (an empty part, lse = -inf, gets weight 0 and no NaN)."""
    total = torch.zeros_like(parts[0], dtype=torch.float64)
    for part, part_lse in zip(parts, part_lses, strict=True):
        weight = torch.exp(part_lse.double() - lse).unsqueeze(-1)
        total += torch.where(weight > 0, weight * part.double(), 0.0)
    return total
