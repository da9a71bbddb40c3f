"""The course's executable specification of tree attention for speculative decoding.

Everything here is pure standard-library Python, slow and obviously correct,
written the way the papers' equations read: token trees, their masks and
FlashSpecInfer's DFS-interval encoding (`pyspec_ref.trees`), and softmax,
attention, FlashAttention-2 tiling and the Flash-Decoding / DeFT merge
(`pyspec_ref.attention`). The GPU kernels of the course are checked against
these functions, never the other way round. Every function validates its
arguments and names the bad one in its error.

Note: ``pyspec_ref.attention`` is the re-exported *function*; it shadows the
submodule of the same name on the package. Import the module's names directly
(``from pyspec_ref.attention import flash_attention``) or get the module with
``importlib.import_module("pyspec_ref.attention")``.
"""

from .attention import (
    attention,
    attention_with_lse,
    flash_attention,
    merge_attention,
    online_softmax,
    online_softmax_stats,
    scores,
    softmax,
    tree_attention,
)
from .trees import (
    ancestors,
    bfs_order,
    bitmask_from_mask,
    causal_mask,
    chain_parents,
    children,
    dense_mask_bits,
    depths,
    dfs_order,
    dfs_times,
    interval_mask_bits,
    mask_from_bitmask,
    parents_from_times,
    relabel,
    root,
    sees,
    tree_bitmask,
    tree_mask,
    tree_mask_from_times,
    validate_parents,
    validate_times,
    validate_topological,
)

__all__ = [
    # trees
    "ancestors",
    "bfs_order",
    "bitmask_from_mask",
    "causal_mask",
    "chain_parents",
    "children",
    "dense_mask_bits",
    "depths",
    "dfs_order",
    "dfs_times",
    "interval_mask_bits",
    "mask_from_bitmask",
    "parents_from_times",
    "relabel",
    "root",
    "sees",
    "tree_bitmask",
    "tree_mask",
    "tree_mask_from_times",
    "validate_parents",
    "validate_times",
    "validate_topological",
    # attention
    "attention",
    "attention_with_lse",
    "flash_attention",
    "merge_attention",
    "online_softmax",
    "online_softmax_stats",
    "scores",
    "softmax",
    "tree_attention",
]
