"""Occupancy arithmetic of course.core.analysis: blocks per SM from threads, shared memory and registers."""

import dataclasses

import pytest

from course.core import analysis, runtime
from course.core.analysis import A100, H100, SM86, blocks_per_sm, limits_for


def test_limits_table_is_the_programming_guides():
    assert (H100.shared_per_sm, H100.reserved_shared_per_block) == (228 * 1024, 1024)
    assert (H100.registers_per_sm, H100.max_blocks_per_sm, H100.max_warps_per_sm) == (65536, 32, 64)
    assert H100.max_threads_per_sm == 2048
    assert limits_for((9, 0)) is H100 and limits_for((8, 0)) is A100
    assert (SM86.max_threads_per_sm, limits_for((8, 9)).max_blocks_per_sm) == (1536, 24)
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100.shared_per_sm = 0


@pytest.mark.parametrize("capability", [(7, 5), (10, 0), (9, 1)])
def test_unknown_capability_is_refused(capability):
    with pytest.raises(ValueError, match=rf"compute capability {capability[0]}\.{capability[1]}.*9\.0"):
        limits_for(capability)


@pytest.mark.parametrize("capability", ["9.0", (9,), [9, 0], (9.0, 0), None])
def test_malformed_capability_is_refused(capability):
    with pytest.raises(ValueError, match="capability must be a"):
        limits_for(capability)


def test_shared_memory_limited():
    # Rung 2's block: one warp, 28672 bytes of tiles, 55 registers per thread (committed H100 row).
    # shared: 28672 + 1024 reserved = 29696 (a multiple of 128); 233472 // 29696 = 7
    # registers: 55 * 32 = 1760 -> 1792 per warp; 16384 per quarter // 1792 = 9, x 4 = 36 warps = 36 blocks
    # warps: 64 // 1 = 64; blocks: 32
    assert blocks_per_sm(32, 28672, 55, limits=H100) == {
        "blocks": 7, "limited_by": "shared memory", "by_shared": 7, "by_registers": 36,
        "by_warps": 64, "by_blocks": 32, "warps": 7}


def test_shared_memory_is_allocated_in_units_of_128_bytes():
    # 10000 + 1024 = 11024 -> 11136 (87 x 128); 233472 // 11136 = 20 (unrounded it would be 21)
    assert blocks_per_sm(32, 10000, 32, limits=H100)["by_shared"] == 20
    # on an A100: 167936 // 11136 = 15
    assert blocks_per_sm(32, 10000, 32, limits=A100)["by_shared"] == 15


def test_register_limited():
    # 256 threads = 8 warps, no shared memory, 100 registers per thread.
    # registers: 100 * 32 = 3200 -> 3328 per warp (13 x 256); 16384 // 3328 = 4 warps per quarter,
    #   16 per SM, 16 // 8 = 2 blocks
    # shared: 1024 reserved only -> 233472 // 1024 = 228; warps: 64 // 8 = 8; blocks: 32
    assert blocks_per_sm(256, 0, 100, limits=H100) == {
        "blocks": 2, "limited_by": "registers", "by_shared": 228, "by_registers": 2,
        "by_warps": 8, "by_blocks": 32, "warps": 16}


def test_registers_are_fitted_per_sub_partition():
    # 40 registers: 1280 per warp. The whole file would take 65536 // 1280 = 51 warps, but each
    # quarter takes 16384 // 1280 = 12, so 48 warps: 48 blocks of one warp, above the 32-block cap.
    result = blocks_per_sm(32, 0, 40, limits=H100)
    assert (result["by_registers"], result["blocks"], result["limited_by"]) == (48, 32, "blocks")
    # 33 registers round up to 40 per thread (1056 -> 1280 per warp): the same count.
    assert blocks_per_sm(32, 0, 33, limits=H100)["by_registers"] == 48


def test_warp_limited():
    # 640 threads = 20 warps, 1000 bytes of shared memory, 24 registers per thread.
    # warps: 64 // 20 = 3
    # registers: 24 * 32 = 768 per warp (already 3 x 256); 16384 // 768 = 21 per quarter, 84 per SM,
    #   84 // 20 = 4
    # shared: 1000 + 1024 = 2024 -> 2048; 233472 // 2048 = 114; blocks: 32
    assert blocks_per_sm(640, 1000, 24, limits=H100) == {
        "blocks": 3, "limited_by": "warps", "by_shared": 114, "by_registers": 4,
        "by_warps": 3, "by_blocks": 32, "warps": 60}
    # An SM of compute capability 8.6 holds 48 warps: 48 // 20 = 2.
    assert blocks_per_sm(640, 1000, 24, limits=SM86)["by_warps"] == 2


def test_ties_name_every_limit():
    # 1024 threads = 32 warps at 32 registers: warps 64 // 32 = 2; registers 32 * 32 = 1024 per warp,
    # 16384 // 1024 = 16 per quarter, 64 per SM, 64 // 32 = 2; shared 114; blocks 32.
    assert blocks_per_sm(1024, 1000, 32, limits=H100)["limited_by"] == "registers and warps"


def test_block_limited_and_unknown_registers():
    # One warp, 4 KiB: shared 233472 // 5120 = 45, warps 64, blocks 32 -> 32; registers not counted.
    assert blocks_per_sm(32, 4096, None, limits=H100) == {
        "blocks": 32, "limited_by": "blocks", "by_shared": 45, "by_registers": None,
        "by_warps": 64, "by_blocks": 32, "warps": 32}


def test_notebook_rungs_fit_seven_blocks_on_an_h100():
    # The committed H100 rows of rungs 6 and 8 (154 and 167 registers): shared memory still decides.
    # k6: 29440 + 1024 = 30464 -> 233472 // 30464 = 7; 154 * 32 = 4928 -> 5120, 16384 // 5120 = 3, 12
    # k8: 29952 + 1024 = 30976 -> 7;                  167 * 32 = 5344 -> 5376, 16384 // 5376 = 3, 12
    for shared, registers in ((29440, 154), (29952, 167)):
        result = blocks_per_sm(32, shared, registers, limits=H100)
        assert (result["blocks"], result["by_registers"], result["limited_by"]) == (7, 12, "shared memory")


@pytest.mark.parametrize(("args", "name"), [
    ((0, 0, 32), "threads"),
    ((1025, 0, 32), "threads"),
    ((32.0, 0, 32), "threads"),
    ((True, 0, 32), "threads"),
    ((32, -1, 32), "shared_bytes"),
    ((32, 227 * 1024 + 1, 32), "shared_bytes"),
    ((32, "0", 32), "shared_bytes"),
    ((32, 0, 0), "registers_per_thread"),
    ((32, 0, 256), "registers_per_thread"),
    ((32, 0, 32.5), "registers_per_thread"),
])
def test_bad_arguments_are_named(args, name):
    with pytest.raises(ValueError, match=name):
        blocks_per_sm(*args, limits=H100)


def test_block_too_large_for_the_register_file():
    # 512 threads = 16 warps at 255 registers: 8160 -> 8192 per warp, 131072 > 65536 per block.
    with pytest.raises(ValueError, match="cannot launch"):
        blocks_per_sm(512, 0, 255, limits=H100)
    # 256 threads = 8 warps at 255: 65536 per block, which fits, once: 16384 // 8192 = 2 per quarter
    assert blocks_per_sm(256, 0, 255, limits=H100)["blocks"] == 1


def test_limits_must_be_sm_limits():
    with pytest.raises(ValueError, match="limits"):
        blocks_per_sm(32, 0, 32, limits=(9, 0))


def test_this_device():
    device = analysis.this_device()
    assert device.limits in analysis.LIMITS.values() and device.sm_count > 0
    assert "compute capability" in str(device) and "per SM" in str(device)
    if runtime.SIMULATOR:
        assert (device.name, device.sm_count, device.limits) == (analysis.H100_NAME, 132, H100)
        assert device.note
    # The default limits are this device's.
    assert blocks_per_sm(32, 0, 32) == blocks_per_sm(32, 0, 32, limits=device.limits)


@pytest.mark.skipif(runtime.SIMULATOR, reason="needs a CUDA GPU")
def test_limits_agree_with_what_the_driver_reports():
    import torch

    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    limits = limits_for((properties.major, properties.minor))
    assert properties.shared_memory_per_multiprocessor == limits.shared_per_sm
    assert properties.shared_memory_per_block_optin == limits.max_shared_per_block
    assert properties.regs_per_multiprocessor == limits.registers_per_sm
    assert properties.max_threads_per_multi_processor == limits.max_threads_per_sm
    assert properties.warp_size == limits.warp_size


def test_torch_operations_lists_the_calls_but_not_the_views():
    import torch

    x = torch.arange(6.0)
    names = analysis.torch_operations(lambda: torch.softmax(x.unsqueeze(0), dim=-1).sum())
    assert names == ["softmax", "sum"]  # unsqueeze is a view: left out
