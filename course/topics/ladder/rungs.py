"""The tree-attention ladder: which rung is which module, what it changes, and which rung it builds on.

Notebooks 03-11 and the benchmark walk this one table, and a test checks that
each rung's lesson is the rung it builds on with holes where the change goes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rung:
    name: str  # the name in results/<device>/ladder.json, e.g. "k4"
    module: str  # solutions/<module>.py (and lessons/<module>.py)
    notebook: str
    change: str  # the one change, in a few words
    previous: str | None = None  # the rung whose kernel this one edits
    skips_tiles: bool = False  # skips key tiles no row sees: its speed depends on the numbering


RUNGS: tuple[Rung, ...] = (
    Rung("k1", "ladder_k1", "03_baseline", "minimal flash attention with the interval mask"),
    Rung("k2", "ladder_k2", "04_sequence_parallelism", "one block per query tile", "ladder_k1"),
    Rung("k3", "ladder_k3", "05_times_in_shared", "DFS times in shared memory", "ladder_k2"),
    Rung("k4", "ladder_k4", "06_coalesced_tiles", "coalesced loads, transposed tiles", "ladder_k3"),
    Rung("k5", "ladder_k5", "07_register_mask", "each tile's mask in a register", "ladder_k4"),
    Rung("k6", "ladder_k6", "08_register_tiling_pv", "register tiling of P.V", "ladder_k5"),
    Rung("k7", "ladder_k7", "09_coalesced_writes", "output written through shared memory",
         "ladder_k6"),
    Rung("k8", "ladder_k8", "10_register_tiling_qk", "register tiling of Q.K^T", "ladder_k7"),
    Rung("k8_dense", "ladder_dense", "11_results", "rung 8 reading a dense N x N mask", "ladder_k8"),
    Rung("k9", "ladder_k9", "11a_tile_skipping", "skip key tiles no row of the block sees",
         "ladder_k8", skips_tiles=True),
    Rung("k10", "ladder_k10", "11b_tile_mask", "the tile mask built once per tree, not per block",
         "ladder_k9", skips_tiles=True),
    Rung("k11", "ladder_k11", "11c_loads_in_flight", "each thread's tile loads in flight together",
         "ladder_k10", skips_tiles=True),
)
BY_NAME = {rung.name: rung for rung in RUNGS}
BY_MODULE = {rung.module: rung for rung in RUNGS}


def edits() -> list[tuple[str, str]]:
    """(previous module, module) for every rung that edits another."""
    return [(rung.previous, rung.module) for rung in RUNGS if rung.previous]


# Notebook 05's find-the-bug kernel is rung 3 with one defect.
FIND_THE_BUG = {"ladder_bug": "ladder_k3"}


def builds_on() -> dict[str, str]:
    """Module -> the module whose kernel it edits: each rung's previous one, and the defective copy
    of rung 3. A lesson shows what it keeps of that kernel, so it must not keep an open answer."""
    return {rung.module: rung.previous for rung in RUNGS if rung.previous} | FIND_THE_BUG


def rung_of(module: str) -> str:
    """'rung 3' for ladder_k3, as the notebooks say it (another kernel of the ladder: its module)."""
    number = re.fullmatch(r"ladder_k(\d+)", module)
    return f"rung {number.group(1)}" if number else module
