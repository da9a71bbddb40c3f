"""The queued rounds (notebook 20, §8) stamped on their GPU streams, beside the baselines of the same
run: where a round's time goes when the hosts only launch.

    python3 tools/queued_timeline.py [--pair medium] [--steps 4 6 8] [--out results/h200]

It runs the parallel bench (`course.capstone.parallel_bench.measure`) with its queued rows only:
plain decoding and the serial decoder as the baselines, then the queued rounds at w = 16 and each
d, greedy and sampling, B = 1 (the draft on a second GPU where there is one). Each queued row's
tokens/s is the median of timed runs that record nothing; the terms of its rounds come from one
more run per prompt whose spans are CUDA events on the two streams
(`queued.QueuedSides.run(timeline=True)`): the target's pass on its GPU (verify_gpu_ms), its median
wait between two verifications (target_wait_ms_median), a message's median way from the stream
that sends it to the stream that waits for it (message_ms_median), and the first rounds
(timeline). The hosts launch ahead of the GPUs, so only the streams can say when a span ran.

Predicted before the first run (one H200, both sides sharing it, the medium pair; the earlier
one-GPU bench measured greedy rounds of 0.62 ms at d = 6 and 0.81 ms at d = 8): at d = 6 the
target's graph about 0.50 ms and its median wait about 0.1 ms (the re-root and selection graphs,
the packet's copy and the event); at d = 8 the wait about 0.25 ms, the re-root waiting for passes
of the growth ahead still queued on the shared GPU. Measured (results/h200/README.md): the graph
0.54 ms and the wait 0.086 ms at d = 6, the wait 0.274 ms at d = 8.

Writes queued_timeline.json (the results schema) and queued_timeline.png (the fastest greedy
queued row's rounds) with --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

SUITE = "queued_timeline"


def measure(pair: str, steps: tuple[int, ...]) -> list[dict]:
    """The bench's baselines and queued rows at `steps` (its widths and tree), on this machine's GPUs."""
    from course.capstone import parallel_bench

    width, _ = parallel_bench.QUEUED
    return parallel_bench.measure(pair=pair, steps=(), wide=None, queued=(width, steps))


def save(rows: list[dict], folder: Path) -> Path:
    """queued_timeline.json and queued_timeline.png in folder."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course.capstone import parallel_figures
    from course.measure import results

    folder.mkdir(parents=True, exist_ok=True)
    document = results.document(SUITE, rows)
    document["gpus"] = max(torch.cuda.device_count(), 1)
    path = folder / f"{SUITE}.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    fastest = parallel_figures.best_parallel(rows, "greedy", "queued")
    rounds = len({e["round"] for e in fastest["timeline"]})
    title = (f"queued rounds on {document['device']}, greedy, d = {fastest['steps']}: rounds 1-{rounds}, "
             "stamped on the streams")
    ax = parallel_figures.timeline(fastest["timeline"], title=title)
    ax.figure.savefig(folder / f"{SUITE}.png", dpi=120, bbox_inches="tight")
    plt.close(ax.figure)
    return path


def main(argv: list[str] | None = None) -> None:
    from course.capstone import parallel_bench

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default=parallel_bench.PAIR)
    parser.add_argument("--steps", type=int, nargs="+", default=list(parallel_bench.QUEUED[1]),
                        help="d, the steps ahead")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("queued_timeline measures on a GPU")
    rows = measure(args.pair, tuple(args.steps))
    if args.out is not None:
        print(f"saved {save(rows, args.out)}")


if __name__ == "__main__":
    main()
