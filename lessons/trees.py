# Student copy, generated from solutions/trees.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
"""Notebook 01: token trees on the GPU. DFS start/end times, the tree mask and its bitmask.

A tree of N tokens is a parent array numbered parent-before-child (the root is
node 0), as speculative decoding appends each token after the one it continues.
DFS times use the preorder convention of `pyspec_ref.trees`: start[v] is v's
preorder index and end[v] the last preorder index in v's subtree, so key k is an
ancestor-or-self of query q exactly when start[k] <= start[q] and end[q] <= end[k]
(FlashSpecInfer §5.1).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import cuda

from course.core.launch import launch, poisoned_empty
from course.core.stubs import todo  # noqa: F401  (the lesson stubs call it)
from course.core.validate import require_same_shape, require_tensor, require_times, require_topological_trees

INDEX_DTYPES = (torch.int32,)
MASK_TILE = 16  # the mask kernel's blocks are MASK_TILE x MASK_TILE threads
TREES_PER_BLOCK = 32
WORD_BITS = 64


@cuda.jit
def dfs_times_kernel(parents, start, end, cursor):
    """One thread per tree: DFS times in two sweeps over the parent array, no stack.

    Because parent[i] < i, a backward sweep sees every child before its parent, so it
    can sum subtree sizes; a forward sweep sees every parent before its children, so
    it can hand each child the next free preorder slot of its parent.
    """
    b = cuda.grid(1)
    if b >= parents.shape[0]:
        return
    n = parents.shape[1]
    # YOUR CODE HERE: exercise trees.dfs_times_kernel, region 1 (delete the todo line when you start)
    todo("trees.dfs_times_kernel", region=1, lines=13)


def dfs_times(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DFS start/end times of a batch of trees: parents (B, N) int32 -> (start, end) (B, N) int32."""
    require_tensor(parents, "parents", ndim=2, dtypes=INDEX_DTYPES)
    require_topological_trees(parents, "parents")
    start, end, cursor = (poisoned_empty(parents.shape, dtype=parents.dtype, device=parents.device)
                          for _ in range(3))
    batch = parents.shape[0]
    blocks = (batch + TREES_PER_BLOCK - 1) // TREES_PER_BLOCK
    launch(dfs_times_kernel, blocks, TREES_PER_BLOCK, parents, start, end, cursor,
           names=("parents", "start", "end", "cursor"))
    return start, end


@cuda.jit
def tree_mask_kernel(start, end, mask):
    """One thread per (query, key) pair of one tree: mask[b, q, k] = k is an ancestor-or-self of q."""
    b = cuda.blockIdx.z
    q, k = cuda.grid(2)
    n = start.shape[1]
    # YOUR CODE HERE: exercise trees.tree_mask_kernel, region 1 (delete the todo line when you start)
    todo("trees.tree_mask_kernel", region=1, lines=2)


def tree_mask(start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """The dense (B, N, N) bool tree mask from (B, N) int32 DFS times."""
    require_tensor(start, "start", ndim=2, dtypes=INDEX_DTYPES)
    require_tensor(end, "end", ndim=2, dtypes=INDEX_DTYPES)
    require_same_shape("start", start, "end", end)
    require_times(start, end)
    batch, n = start.shape
    mask = poisoned_empty((batch, n, n), dtype=torch.bool, device=start.device)
    tiles = (n + MASK_TILE - 1) // MASK_TILE
    launch(tree_mask_kernel, (tiles, tiles, batch), (MASK_TILE, MASK_TILE), start, end, mask,
           names=("start", "end", "mask"))
    return mask


@cuda.jit
def tree_bitmask_kernel(start, end, words):
    """One thread per (query, 64-key word): bit j of words[b, q, w] says whether q sees key 64w + j."""
    b = cuda.blockIdx.y
    q = cuda.grid(1) // words.shape[2]
    w = cuda.grid(1) % words.shape[2]
    n = start.shape[1]
    if q >= n:
        return
    # YOUR CODE HERE: exercise trees.tree_bitmask_kernel, region 1 (delete the todo line when you start)
    todo("trees.tree_bitmask_kernel", region=1, lines=6)


def tree_bitmask(start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """SpecInfer's bitmask: (B, N, ceil(N/64)) int64 words (bit j of word w = key 64w + j).

    torch has no full uint64 support, so the words are stored as int64: bit 63 is the sign bit.
    """
    require_tensor(start, "start", ndim=2, dtypes=INDEX_DTYPES)
    require_tensor(end, "end", ndim=2, dtypes=INDEX_DTYPES)
    require_same_shape("start", start, "end", end)
    require_times(start, end)
    batch, n = start.shape
    n_words = (n + WORD_BITS - 1) // WORD_BITS
    words = poisoned_empty((batch, n, n_words), dtype=torch.int64, device=start.device)
    threads = 128
    blocks = (n * n_words + threads - 1) // threads
    launch(tree_bitmask_kernel, (blocks, batch), threads, start, end, words,
           names=("start", "end", "words"))
    return words

