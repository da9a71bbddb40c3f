"""Counting what a kernel's memory accesses cost, for the predictions the ladder notebooks make.

A warp's access to shared memory is served in one pass when its 32 threads touch 32
different banks (or the same word: a broadcast); k threads on k different words of
one bank take k passes (bank conflicts). A warp's access to global memory moves every
32-byte sector that any thread touches. Both are computed here from the addresses,
so the notebooks' claims about rungs come from the kernels' own index arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyspec_ref

BANKS = 32
WORD = 4  # bytes in a bank word (float32, int32)
SECTOR = 32  # bytes the memory system moves per sector
WARP = 32


def _words(addresses: Iterable[int], name: str) -> list[int]:
    words = list(addresses)
    if not words or not all(isinstance(w, int) and w >= 0 for w in words):
        raise ValueError(f"{name} must be non-negative int word indices, one per thread")
    return words


def bank_passes(word_addresses: Iterable[int]) -> int:
    """Passes one warp-wide shared-memory access takes: the most distinct words in one bank."""
    words = _words(word_addresses, "word_addresses")
    per_bank: dict[int, set[int]] = {}
    for word in words:
        per_bank.setdefault(word % BANKS, set()).add(word)
    return max(len(distinct) for distinct in per_bank.values())


def sectors(byte_addresses: Iterable[int], size: int = WORD) -> int:
    """32-byte sectors one warp-wide global access of `size`-byte elements touches."""
    addresses = _words(byte_addresses, "byte_addresses")
    touched = set()
    for address in addresses:
        touched.update(range(address // SECTOR, (address + size - 1) // SECTOR + 1))
    return len(touched)


def row_major(row: int, column: int, row_length: int) -> int:
    """Word index of element (row, column) of a row-major array with rows of row_length words."""
    return row * row_length + column


def tile_pairs(parents, tile: int) -> tuple[int, int]:
    """(visible, total): (query tile, key tile) pairs in which some query sees some key.

    Rungs 1-8 do the work of every pair; rung 9 skips the pairs that are not visible.
    """
    if not isinstance(tile, int) or tile < 1:
        raise ValueError(f"tile must be a positive int, got {tile!r}")
    parents = list(parents)
    pyspec_ref.validate_parents(parents)
    pyspec_ref.validate_topological(parents)
    tiles = (len(parents) + tile - 1) // tile
    # Parents come before children, so each node's ancestor tiles are its parent's plus its own
    # (one pass, instead of a validated ancestor walk per node).
    ancestor_tiles: list[frozenset[int]] = []
    visible = set()
    for node, parent in enumerate(parents):
        own = frozenset({node // tile})
        ancestor_tiles.append(own if parent < 0 else ancestor_tiles[parent] | own)
        visible.update((node // tile, key_tile) for key_tile in ancestor_tiles[node])
    return len(visible), tiles * tiles
