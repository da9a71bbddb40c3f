"""The two processes of parallel tree generation (notebook 20) and their supervision: SwiftSpec's
draft and target workers (`course.capstone.protocol`), one process and one GPU each, exchanging
the messages through one of `wire.TRANSPORTS`: shared memory (both processes run on one host),
NCCL between two GPUs, or gloo.

`launch` starts two processes (`python -m course.capstone.processes <role> ...`), rank 0 the
target (it hosts the rendezvous store), rank 1 the draft. Each checks the other with a handshake
on the CPU before loading its model (`wire.check_hello`): a mismatched pair is refused before any
GPU work. Each watches the other (`wire.Watchdog`): a dead, frozen or silent peer stops it within
seconds, with one line saying which. Then each runs the job's generations one after another, every
one starting after both sides have prefilled (a barrier). The launcher reads their JSON results,
or raises ParallelError with each side's last word.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path

import torch

from course.core.regions import ROOT

from . import decoder, wire
from .parallel import (
    DEFAULT_DRAFT_TREE,
    DEFAULT_GROWTH,
    DEFAULT_STEPS,
    ParallelGeneration,
    check_critical,
    check_pair,
    check_prompt,
    draft_side,
    relative_events,
    sync,
)
from .protocol import Timeline, draft_rounds, run_linked, target_rounds
from .sides import GROWTHS, TargetSide


class ParallelError(RuntimeError):
    """A two-process run that failed: the message says which side stopped and why."""


@dataclasses.dataclass
class Run:
    """One generation of a job: the prompt (token ids), SwiftSpec's d, the mode, the draft's seed."""

    prompt: list[int]
    steps: int = DEFAULT_STEPS
    mode: str = "greedy"
    seed: int = 0


@dataclasses.dataclass
class Job:
    """What both processes of a `launch` do: their models (safetensors files written by
    course.capstone.train), dtypes and devices, the transport, the settings shared by every run, the
    runs, and the fault handling's timeouts (seconds). `pause` ([role, round], tests only): that side
    stops answering after the round, alive but silent, as a hung process would."""

    target: str
    draft: str
    runs: list[Run]
    dtypes: dict = dataclasses.field(default_factory=lambda: {"target": "float32", "draft": "float32"})
    devices: dict = dataclasses.field(default_factory=lambda: {"target": "cpu", "draft": "cpu"})
    transport: str = "gloo"
    tree_size: int = 8
    width: int = 2
    branch: int = 4
    growth: str = DEFAULT_GROWTH
    draft_tree: str = DEFAULT_DRAFT_TREE
    critical: int = 0  # draft steps after each re-root (`protocol.draft_rounds`)
    max_new_tokens: int = 16
    eos: int | None = None
    backend: str = "kernels"
    impl: str | None = None
    threads: int = 1  # CPU threads per process (the simulator's two processes share the cores)
    peer_timeout: float = 5.0
    message_timeout: float = 300.0  # the first kernel calls compile (Triton), the peer waits meanwhile
    pause: list | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Job:
        values = json.loads(text)
        values["runs"] = [Run(**run) for run in values["runs"]]
        return cls(**values)

    def runs_crc(self) -> int:
        """One number for everything both sides must agree on besides their models."""
        shared = {k: v for k, v in dataclasses.asdict(self).items()
                  if k not in ("target", "draft", "dtypes", "devices", "pause", "threads")}
        return zlib.crc32(json.dumps(shared, sort_keys=True).encode())


def _config(path: str):
    from .model import ModelConfig
    from .weights import read_metadata

    if not Path(path).exists():
        raise FileNotFoundError(f"{path} does not exist")
    meta = read_metadata(Path(path))
    if "config" not in meta:
        raise ValueError(f"{path} has no 'config' metadata: not written by course.capstone.train")
    return ModelConfig(**json.loads(meta["config"]))


def check_job(job: Job) -> None:
    """Everything that can be refused before a process starts: the pair (vocabularies, dtypes),
    the settings, each prompt, the transport and the devices."""
    t_config, d_config = _config(job.target), _config(job.draft)
    check_pair(t_config, d_config, getattr(torch, job.dtypes["target"]), getattr(torch, job.dtypes["draft"]))
    cfg = decoder.settings(job.tree_size, job.width, job.branch, mode="greedy")
    decoder._positive_int(job.max_new_tokens, "max_new_tokens")
    if not job.runs:
        raise ValueError("a job needs at least one run")
    for i, run in enumerate(job.runs):
        decoder.settings(cfg.tree_size, cfg.width, cfg.branch, mode=run.mode)
        check_prompt(run.prompt, t_config.vocab_size)
        if isinstance(run.steps, bool) or not isinstance(run.steps, int) or run.steps < 0:
            raise ValueError(f"runs[{i}].steps must be an int >= 0, got {run.steps!r}")
    if job.growth not in GROWTHS:
        raise ValueError(f"growth must be one of {GROWTHS}, got {job.growth!r}")
    draft_side(job.draft_tree)  # a clear error before any process starts
    check_critical(job.critical, "parallel")
    if job.transport not in wire.TRANSPORTS:
        raise ValueError(f"transport must be one of {wire.TRANSPORTS}, got {job.transport!r}")
    if job.transport == "nccl" and (job.devices["target"] == job.devices["draft"]
                                    or "cuda" not in job.devices["target"]):
        raise ValueError("transport 'nccl' needs the target and the draft on two different GPUs "
                         f"(got {job.devices}); two processes sharing one GPU talk through gloo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launch:
    """Two running worker processes (see `launch`); `wait` collects their results."""

    def __init__(self, job: Job, folder: Path | None = None, check: bool = True):
        if check:
            check_job(job)
        self.job = job
        self.own_folder = folder is None  # removed after a run that succeeded
        self.folder = Path(folder or tempfile.mkdtemp(prefix="parallel-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "job.json").write_text(job.to_json())
        port = _free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (the lent two-GPU machine needs it)
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # a lost peer is reported once, by the watchdog
        self.processes = {}
        for role in wire.ROLES:
            log = open(self.folder / f"{role}.log", "w")  # noqa: SIM115  (closed in wait)
            self.processes[role] = subprocess.Popen(
                [sys.executable, "-m", "course.capstone.processes", role, str(self.folder / "job.json"),
                 str(self.folder), str(port)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            log.close()

    def paused(self, role: str) -> bool:
        """Whether `role` has reached the job's pause point (tests)."""
        return (self.folder / f"{role}.paused").exists()

    def wait(self, timeout: float = 600.0) -> list[ParallelGeneration]:
        """Both processes' results, per run; ParallelError if either failed. When one side exits
        with an error the other gets peer_timeout + 3 s to stop by itself, then is killed."""
        deadline = time.monotonic() + timeout
        first_failure = None
        while any(p.poll() is None for p in self.processes.values()):
            now = time.monotonic()
            if first_failure is None and any(p.poll() not in (None, 0) for p in self.processes.values()):
                first_failure = now
            if now > deadline or (first_failure and now - first_failure > self.job.peer_timeout + 3):
                for p in self.processes.values():
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                break
            time.sleep(0.05)
        codes = {role: p.poll() for role, p in self.processes.items()}
        if any(code != 0 for code in codes.values()):
            raise ParallelError(self._failure(codes) + f"\n(both processes' logs: {self.folder})")
        generations = self._results()
        if self.own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        return generations

    def _failure(self, codes: dict) -> str:
        lines = []
        for role, code in codes.items():
            said = self.folder / f"{role}.error"
            if said.exists():
                lines.append(said.read_text().strip())
            elif code != 0:
                tail = (self.folder / f"{role}.log").read_text().strip().splitlines()[-3:]
                lines.append(f"the {role} process exited with status {code}"
                             + (": " + " | ".join(tail) if tail else ""))
        return "\n".join(lines)

    def _results(self) -> list[ParallelGeneration]:
        target = json.loads((self.folder / "target.json").read_text())
        draft = json.loads((self.folder / "draft.json").read_text())
        out = []
        for run, t, d in zip(self.job.runs, target, draft, strict=True):
            events = relative_events(t["events"] + d["events"], t["t0"])
            out.append(ParallelGeneration(t["tokens"], t["seconds"], t["target_calls"], d["draft_calls"],
                                          t["accepted"], d["reused"], events, run.mode, "parallel", run.steps,
                                          2))
        return out


def launch(job: Job, timeout: float = 600.0) -> list[ParallelGeneration]:
    """Run `job` in two processes (see the module docstring) and return each run's generation."""
    return Launch(job).wait(timeout)



# ------------------------------------------------------------------ python -m course generate --parallel


def pair_job(pair: str, runs: list[Run], **options) -> Job:
    """A job for the trained pair `pair`: on a machine with two GPUs the target on cuda:0 and the
    draft on cuda:1 in float16, the messages through shared memory (the fastest transport measured:
    notebook 20); in the simulator both on the CPU in float32 through gloo."""
    from course.core import runtime

    from .weights import weight_path

    paths = {}
    for role in wire.ROLES:
        paths[role] = weight_path(pair, role)
        if not paths[role].exists():
            from .weights import train_command

            raise ValueError(f"{paths[role]} does not exist: train the '{pair}' pair with "
                             f"`{train_command(pair)}`")
    if runtime.on_gpu():
        gpu = dict(dtypes={"target": "float16", "draft": "float16"},
                   devices={"target": "cuda:0", "draft": "cuda:1"}, transport="shm")
        options = gpu | options
    return Job(str(paths["target"]), str(paths["draft"]), runs, **options)



# --------------------------------------------------------------------------- inside a worker


def _pause_if_asked(job: Job, role: str, round_: int, folder: Path) -> None:
    if job.pause and job.pause[0] == role and job.pause[1] == round_:
        (folder / f"{role}.paused").write_text(str(round_))
        while True:  # alive (the watchdog still beats) but silent, until the peer gives up on it
            time.sleep(1.0)


def _pausing(worker: Generator, job: Job, role: str, folder: Path) -> Generator:
    """The worker, stopping for good after it has answered round job.pause[1] (tests)."""
    value = None
    answered = 0
    while True:
        try:
            op = worker.send(value)
        except StopIteration as finished:
            return finished.value
        value = yield op
        if not isinstance(op, str):
            _pause_if_asked(job, role, answered, folder)
            answered += 1


def _worker(role: str, job_path: str, folder: str, port: int) -> int:
    import torch.distributed as dist

    from .weights import load_model

    job = Job.from_json(Path(job_path).read_text())
    folder = Path(folder)
    rank = wire.ROLES.index(role)
    error_file = str(folder / f"{role}.error")
    device = torch.device(job.devices[role])
    if device.type == "cpu":
        torch.set_num_threads(job.threads)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    # The group's own timeout backs up the watchdog's, which says more: a little later.
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=timedelta(seconds=job.message_timeout + 5))
    watchdog = wire.Watchdog(store, rank, peer_timeout=job.peer_timeout, message_timeout=job.message_timeout,
                             error_file=error_file).start()
    try:
        config = _config(getattr(job, role))
        dtype = getattr(torch, job.dtypes[role])
        mine = wire.hello(role, config.vocab_size, dtype, tree_size=job.tree_size, width=job.width,
                          branch=job.branch, max_new_tokens=job.max_new_tokens, eos=job.eos,
                          runs_crc=job.runs_crc())
        both = [torch.zeros_like(mine) for _ in range(2)]
        dist.all_gather(both, mine)
        wire.check_hello(mine.tolist(), both[1 - rank].tolist())
        if device.type == "cuda":
            torch.cuda.set_device(device)
        group = dist.new_group([0, 1], backend="nccl") if job.transport == "nccl" else None
        model = load_model(getattr(job, role), device, dtype)
        link = _link(job, rank, config.vocab_size, device, group, folder, watchdog)
        built: dict = {}
        results = [_one_run(job, run, role, model, link, folder, built) for run in job.runs]
        link.close()
        (folder / f"{role}.json").write_text(json.dumps(results))
    except wire.PairMismatch as error:
        watchdog.stop()  # the peer finds the same mismatch itself
        wire.report(role, str(error), error_file)
        os._exit(wire.EXIT_MISMATCH)
    except wire.PeerLost as error:
        watchdog.fail(str(error), tell_peer=False)
    except Exception as error:
        traceback.print_exc()
        watchdog.fail(f"{type(error).__name__}: {error}", status=wire.EXIT_ERROR)
    watchdog.stop()
    dist.barrier()  # the target hosts the store: it leaves last
    dist.destroy_process_group()
    return 0


def _link(job: Job, rank: int, vocab_size: int, device, group, folder: Path, watchdog: wire.Watchdog):
    """This side's end of the job's transport (`wire.TRANSPORTS`)."""
    if job.transport == "shm":  # the launch's folder holds the file both processes map
        return wire.Mailbox(folder / "mailbox", rank, job.tree_size, vocab_size, watchdog=watchdog)
    return wire.Link(rank, job.tree_size, vocab_size, device if group else "cpu", group=group,
                     nccl=group is not None, watchdog=watchdog)


def _side(job: Job, run: Run, role: str, model, built: dict):
    """This process's side for the run's (mode, d), built on first use for the job's longest prompt
    (on a GPU its graphs are captured then) and reused by the job's later runs."""
    key = (run.mode, run.steps)
    if key not in built:
        cfg = decoder.settings(job.tree_size, job.width, job.branch, mode=run.mode)
        sizes = dict(max_prompt=max(len(r.prompt) for r in job.runs), max_new_tokens=job.max_new_tokens,
                     backend=job.backend, impl=job.impl)
        built[key] = (draft_side(job.draft_tree)(model, cfg, run.steps, growth=job.growth, **sizes)
                      if role == "draft"
                      else TargetSide(model, cfg, **sizes))
    return built[key]


@torch.no_grad()
def _one_run(job: Job, run: Run, role: str, model, link: wire.Link, folder: Path, built: dict) -> dict:
    import torch.distributed as dist

    side = _side(job, run, role, model, built)
    side.start(run.prompt, run.seed if role == "draft" else run.seed + 1)
    sync(model.device)
    dist.barrier()  # both sides prefilled: the clock starts together
    clock = Timeline()
    t0 = time.perf_counter()
    if role == "draft":
        worker = draft_rounds(side, run.steps, "parallel", clock, job.critical)
    else:
        worker = target_rounds(side, job.max_new_tokens, job.eos, clock)
    if job.pause:
        worker = _pausing(worker, job, role, folder)
    result = run_linked(worker, link, clock, role, with_q=run.mode == "sample")
    sync(model.device)
    seconds = time.perf_counter() - t0
    if role == "draft":
        return {"draft_calls": side.calls, "reused": result, "events": clock.events}
    tokens, accepted = result
    return {"tokens": tokens, "accepted": accepted, "target_calls": side.calls, "seconds": seconds, "t0": t0,
            "events": clock.events}


if __name__ == "__main__":  # a worker process of `launch`: role, job file, folder, port
    import course  # noqa: F401  (first: GPU or simulator)
    from course.capstone.processes import _worker  # the module's own classes, not this script's copy

    sys.exit(_worker(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
