"""Counting what a kernel's memory accesses cost, for the predictions the ladder notebooks make.

A warp's access to shared memory is served in one pass when its 32 threads touch 32
different banks (or the same word: a broadcast); k threads on k different words of
one bank take k passes (bank conflicts). A warp's access to global memory moves every
32-byte sector that any thread touches. Both are computed here from the addresses,
so the notebooks' claims about rungs come from the kernels' own index arithmetic.

How many blocks an SM holds at once (occupancy) is counted here too, from per-SM limits of
each compute capability (`SMLimits`, `limits_for`, `this_device`) and a kernel's threads,
shared memory and registers per block (`blocks_per_sm`): the GPU limits live in this one place.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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


# Occupancy: how many blocks of a kernel an SM holds at once.

KiB = 1024


@dataclass(frozen=True)
class SMLimits:
    """Per-SM resource limits of one compute capability.

    From the CUDA C++ Programming Guide, table "Technical Specifications per Compute Capability";
    the allocation units and the reserved shared memory are those that CUDA's occupancy calculator
    (`cuda_occupancy.h`, which `cudaOccupancyMaxActiveBlocksPerMultiprocessor` follows) uses.
    """

    capability: tuple[int, int]
    shared_per_sm: int  # bytes of shared memory per SM, at the largest shared-memory carveout
    max_shared_per_block: int  # bytes one block may use (above 48 KiB only by opting in)
    reserved_shared_per_block: int  # bytes the system keeps for each resident block
    max_blocks_per_sm: int
    max_warps_per_sm: int
    registers_per_sm: int = 64 * KiB  # 32-bit registers
    max_registers_per_block: int = 64 * KiB
    max_registers_per_thread: int = 255
    max_threads_per_block: int = 1024
    warp_size: int = WARP
    # Registers are allocated per warp, in units of 256 (8 per thread of the warp). Per warp,
    # because a warp's 32 threads execute each instruction together, so each register the
    # compiler names is 32 values, one per lane, allocated and freed with the warp; in units of
    # 256 because that is the granularity at which the hardware hands out the register file (the
    # "register allocation unit size" of NVIDIA's occupancy calculator). So 33 registers per
    # thread cost a warp 1280 registers (5 units), not 33 x 32 = 1056.
    register_unit: int = 256
    # Each of the SM's four sub-partitions (one warp scheduler each) has its own quarter of the
    # register file, and a warp's registers lie in one of them; so warps are fitted per quarter.
    sub_partitions: int = 4
    shared_unit: int = 128  # a block's shared memory (with the reserved part) is allocated in these

    @property
    def max_threads_per_sm(self) -> int:
        return self.max_warps_per_sm * self.warp_size

    def describe(self) -> str:
        """One line with the limits, as the notebooks print them."""
        return (f"per SM: {self.shared_per_sm // KiB} KiB of shared memory "
                f"({self.reserved_shared_per_block // KiB} KiB reserved per block, at most "
                f"{self.max_shared_per_block // KiB} KiB per block), {self.registers_per_sm} registers "
                f"(allocated per warp in units of {self.register_unit}), {self.max_warps_per_sm} warps "
                f"({self.max_threads_per_sm} threads), {self.max_blocks_per_sm} blocks")


# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability".
H100 = SMLimits(capability=(9, 0), shared_per_sm=228 * KiB, max_shared_per_block=227 * KiB,
                reserved_shared_per_block=1 * KiB, max_blocks_per_sm=32, max_warps_per_sm=64)
A100 = SMLimits(capability=(8, 0), shared_per_sm=164 * KiB, max_shared_per_block=163 * KiB,
                reserved_shared_per_block=1 * KiB, max_blocks_per_sm=32, max_warps_per_sm=64)
SM86 = SMLimits(capability=(8, 6), shared_per_sm=100 * KiB, max_shared_per_block=99 * KiB,  # RTX 30, A6000
                reserved_shared_per_block=1 * KiB, max_blocks_per_sm=16, max_warps_per_sm=48)
SM89 = SMLimits(capability=(8, 9), shared_per_sm=100 * KiB, max_shared_per_block=99 * KiB,  # RTX 40, L4, L40
                reserved_shared_per_block=1 * KiB, max_blocks_per_sm=24, max_warps_per_sm=48)
LIMITS = {limits.capability: limits for limits in (A100, SM86, SM89, H100)}

# The GPU of the committed measurements (results/h100), which the simulator stands in for.
H100_NAME = "NVIDIA H100 80GB HBM3"
H100_SMS = 132  # SMs of an H100 SXM (a product fact, not a compute-capability one)


def limits_for(capability) -> SMLimits:
    """The per-SM limits of compute capability (major, minor), e.g. limits_for((9, 0))."""
    if (not isinstance(capability, tuple) or len(capability) != 2
            or not all(isinstance(part, int) and part >= 0 for part in capability)):
        raise ValueError(f"capability must be a (major, minor) tuple of ints, got {capability!r}")
    if capability not in LIMITS:
        known = ", ".join(f"{major}.{minor}" for major, minor in sorted(LIMITS))
        raise ValueError(f"no SM limits for compute capability {capability[0]}.{capability[1]} "
                         f"(course.core.analysis has {known}); add a row from the CUDA C++ Programming "
                         "Guide's table \"Technical Specifications per Compute Capability\"")
    return LIMITS[capability]


@dataclass(frozen=True)
class Device:
    """The GPU whose limits a notebook reasons with: the one it runs on, or the H100 standing in."""

    name: str
    sm_count: int
    limits: SMLimits
    note: str = ""  # why these limits, when they are not the running GPU's own

    def __str__(self) -> str:
        major, minor = self.limits.capability
        head = f"{self.name}: compute capability {major}.{minor}, {self.sm_count} SMs"
        return head + (f" ({self.note})" if self.note else "") + "\n" + self.limits.describe()


def this_device() -> Device:
    """The device this notebook runs on: the GPU's own limits, or in the simulator the H100's."""
    from course.core import runtime  # already imported with the course package

    if runtime.SIMULATOR:
        return Device(H100_NAME, H100_SMS, H100, "the simulator stands in for the GPU of the committed "
                      "measurements")
    import torch

    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    capability = (properties.major, properties.minor)
    if capability not in LIMITS:
        return Device(properties.name, properties.multi_processor_count, H100,
                      f"course.core.analysis has no limits for its compute capability {capability[0]}."
                      f"{capability[1]}, so these are the H100's")
    return Device(properties.name, properties.multi_processor_count, LIMITS[capability])


def _count(value, name: str, low: int, high: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high} ({why}), got {value}")
    return value


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def blocks_per_sm(threads: int, shared_bytes: int, registers_per_thread: int | None,
                  limits: SMLimits | None = None) -> dict:
    """How many blocks of a kernel one SM holds at once, and which resource limits it.

    threads and shared_bytes are per block, registers_per_thread as the compiler reports it;
    None means "not known": registers are then left out of the count (by_registers is None).
    limits defaults to this_device()'s. Returns {"blocks", "limited_by", "by_shared",
    "by_registers", "by_warps", "by_blocks", "warps"}: each "by_" the blocks that resource alone
    allows, "blocks" their minimum, "limited_by" the resource(s) reaching it (joined by " and "),
    "warps" the resident warps. The arithmetic is that of CUDA's occupancy calculator, at the
    largest shared-memory carveout and without its rarer limits (block barriers); on an H100 it
    agreed with the driver's cudaOccupancyMaxActiveBlocksPerMultiprocessor for 448 launches
    (register counts 18 to 210, 32 to 1024 threads, up to 200 KB of shared memory).
    """
    limits = this_device().limits if limits is None else limits
    if not isinstance(limits, SMLimits):
        raise ValueError(f"limits must be an SMLimits (see limits_for), got {limits!r}")
    _count(threads, "threads", 1, limits.max_threads_per_block, "threads per block")
    _count(shared_bytes, "shared_bytes", 0, limits.max_shared_per_block, "shared memory per block")
    warps = -(-threads // limits.warp_size)

    by = {}
    shared = _round_up(shared_bytes + limits.reserved_shared_per_block, limits.shared_unit)
    by["shared memory"] = limits.shared_per_sm // shared
    if registers_per_thread is None:
        by_registers = None
    else:
        _count(registers_per_thread, "registers_per_thread", 1, limits.max_registers_per_thread,
               "registers per thread")
        per_warp = _round_up(registers_per_thread * limits.warp_size, limits.register_unit)
        # The launch itself fails when a block needs more than max_registers_per_block (the
        # hardware check counts the block's warps rounded up to whole sets of sub-partitions).
        if per_warp * _round_up(warps, limits.sub_partitions) > limits.max_registers_per_block:
            raise ValueError(f"threads = {threads} with registers_per_thread = {registers_per_thread} "
                             f"need more than the {limits.max_registers_per_block} registers a block "
                             "may have: such a block cannot launch")
        warps_by_registers = (limits.registers_per_sm // limits.sub_partitions // per_warp
                              * limits.sub_partitions)
        by_registers = by["registers"] = warps_by_registers // warps
    by["warps"] = limits.max_warps_per_sm // warps
    by["blocks"] = limits.max_blocks_per_sm
    blocks = min(by.values())
    return {"blocks": blocks,
            "limited_by": " and ".join(name for name, allowed in by.items() if allowed == blocks),
            "by_shared": by["shared memory"], "by_registers": by_registers, "by_warps": by["warps"],
            "by_blocks": by["blocks"], "warps": blocks * warps}


# --------------------------------------------------------------------------- PyTorch operations

# Views, attribute reads and dtype conversions (no-ops in float32) launch nothing and move no
# bytes: left out of the count.
QUIET_OPERATIONS = frozenset({"__get__", "unsqueeze", "squeeze", "to"})


def torch_operations(fn) -> list[str]:
    """The PyTorch functions and methods fn() calls, in order, without QUIET_OPERATIONS: roughly
    the kernels an eager PyTorch implementation launches (notebook 15 counts its baseline's)."""
    import torch

    class Recorder(torch.overrides.TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Recorder() as recorder:
        fn()
    return [name for name in recorder.names if name not in QUIET_OPERATIONS]
