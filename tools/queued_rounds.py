"""What a parallel round would cost if the host only launched (notebook 20, §8): device tensors as
messages through NCCL, and no host read anywhere in the loop.

Two processes on two GPUs play SwiftSpec's rounds (§3.1) with stand-in GPU work. Each round the
target receives SUBTREE (2 * bs + 5 int64, a device tensor, NCCL), runs its pass and sends ACCEPTED;
the draft receives ACCEPTED, runs its work between the verdict and the next subtree (its critical
path: re-root, top-up, selection), sends SUBTREE and queues its growth ahead. The work is
`torch.cuda._sleep`, calibrated against CUDA events in the same run, so that only the messages and
the launching are real: what is measured is the round's overhead on top of the GPU work, for two
ways of driving it, at several lengths of the draft's critical path:

  queued   each host queues every round at once; the GPUs order the work by themselves through the
           messages (NCCL's receive waits on the device). The floor of "the host only launches".
  synced   each host waits for each message to arrive (as a host that must read it to decide the
           next launch does), then queues the next step: one host round trip per message.

    python3 tools/queued_rounds.py [--rounds 200] [--out results/h200x2]

Predicted before the first run: queued, an overhead of about 0.03 ms a round (two NCCL messages,
posted before their data is ready, of about 0.015 ms each); synced, about 0.1 ms (a host round trip
per message on top).

Writes queued_rounds.json (the results schema; its rows are "modelled": the GPU work is a
stand-in): per mode and critical path the median round (median_ms) over REPEATS, the target's wait
(wait_ms, the round less its pass) and the overhead (overhead_ms, the wait less the draft's
critical path). Needs two GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SUITE = "queued_rounds"
TREE_SIZE = 48
MESSAGE = 2 * TREE_SIZE + 5  # int64s, as course.capstone.wire's
# ms of stand-in GPU work: the target's pass (verify_gpu_ms in results/h200x2/parallel.json, run j:
# 0.50 ms), the draft's growth ahead (shorter than the pass, so that it never delays the re-root),
# and the draft's work between the verdict and the next subtree, swept: none, about a re-root and a
# selection, and those with one or two draft passes.
TARGET_MS, AHEAD_MS = 0.50, 0.40
CRITICAL_MS = (0.0, 0.05, 0.15, 0.25)
REPEATS = 5
MODES = ("queued", "synced")


def _cycles_per_ms() -> float:
    """torch.cuda._sleep's cycles per ms on this GPU, from CUDA events around a long sleep."""
    cycles = 20_000_000
    torch.cuda._sleep(cycles // 10)  # warm-up
    began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began.record()
    torch.cuda._sleep(cycles)
    ended.record()
    ended.synchronize()
    return cycles / began.elapsed_time(ended)


def _rounds(rank: int, rounds: int, mode: str, critical_ms: float, cycles_per_ms: float) -> float:
    """Play `rounds` rounds; the ms per round, from the target's first wait to its last reply."""
    inbox = torch.zeros(MESSAGE, dtype=torch.int64, device="cuda")
    outbox = torch.arange(MESSAGE, dtype=torch.int64, device="cuda")
    peer = 1 - rank
    dist.barrier()
    torch.cuda.synchronize()
    began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began.record()
    for _ in range(rounds):
        if rank == 1:  # the draft: send SUBTREE, grow ahead, wait for the verdict, re-root and select
            dist.send(outbox, peer)
            torch.cuda._sleep(int(AHEAD_MS * cycles_per_ms))
            dist.recv(inbox, peer)
            if mode == "synced":
                torch.cuda.current_stream().synchronize()
            torch.cuda._sleep(int(critical_ms * cycles_per_ms))
        else:  # the target: wait for SUBTREE, verify, send ACCEPTED
            dist.recv(inbox, peer)
            if mode == "synced":
                torch.cuda.current_stream().synchronize()
            torch.cuda._sleep(int(TARGET_MS * cycles_per_ms))
            dist.send(outbox, peer)
    ended.record()
    torch.cuda.synchronize()
    dist.barrier()
    return began.elapsed_time(ended) / rounds


def _worker(rank: int, rounds: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    cycles_per_ms = _cycles_per_ms()
    measured = []
    for mode in MODES:
        for critical_ms in CRITICAL_MS:
            _rounds(rank, 10, mode, critical_ms, cycles_per_ms)  # warm-up: connections, first launches
            per_round = [_rounds(rank, rounds, mode, critical_ms, cycles_per_ms) for _ in range(REPEATS)]
            measured.append((mode, critical_ms, per_round))
    if rank == 0:
        queue.put(dict(measured=measured, cycles_per_ms=cycles_per_ms))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--port", type=int, default=29533)
    args = parser.parse_args(argv)
    if torch.cuda.device_count() < 2:
        sys.exit("queued_rounds needs two GPUs")
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_worker, args=(args.rounds, args.port, queue), nprocs=2, join=True)
    got = queue.get()
    from course.measure import results  # here, not in the workers: it picks the device runtime

    rows = []
    for mode, critical_ms, per_round in got["measured"]:
        round_ms = statistics.median(per_round)
        overhead = round_ms - TARGET_MS - critical_ms
        rows.append(dict(name=f"parallel, {mode}", mode=mode, median_ms=round_ms, modelled=True,
                         target_ms=TARGET_MS, critical_ms=critical_ms, ahead_ms=AHEAD_MS,
                         wait_ms=round_ms - TARGET_MS, overhead_ms=overhead, rounds=args.rounds,
                         repeats_ms=per_round))
        print(f"{mode:7s} draft's critical work {critical_ms:.2f} ms: a round of {round_ms:.3f} ms, the "
              f"target waits {round_ms - TARGET_MS:.3f} ms, of which {overhead:.3f} ms are the messages "
              "and the launching")
    document = results.document(SUITE, rows)
    document.update(gpus=2, message_ints=MESSAGE, cycles_per_ms=got["cycles_per_ms"])
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{SUITE}.json"
        path.write_text(json.dumps(document, indent=1) + "\n")
        print(f"saved {path}")

if __name__ == "__main__":
    main()
