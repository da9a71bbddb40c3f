"""SwiftSpec's parallel tree generation with the capstone's models (notebook 20): the draft and the
target in two processes, each with its own GPU, exchanging the messages of
`pyspec_ref.parallel_tree` through torch.distributed (NCCL between two GPUs, gloo on a CPU).

Each worker is a generator (`draft_rounds`, `target_rounds`) that yields the messages it sends and
RECV where it waits for one; its work is done through `course.capstone.sides`. Two drivers run
them:

* `generate`: both in this process, one after the other in the order the messages impose
  (lockstep). With schedule="serial" this is serial tree generation with the same code (the draft
  steps after re-rooting); with "parallel" it produces exactly the tokens of the two-process run
  (each side has its own random generator, and the number of draft steps per round is fixed), so
  it is what the tests of exactness run.
* `launch`: two processes (`python -m course.capstone.parallel <role> ...`), rank 0 the target
  (it hosts the rendezvous store), rank 1 the draft. Each checks the other with a handshake on the
  CPU before loading its model (`wire.check_hello`), watches it (`wire.Watchdog`), then runs the
  job's generations one after another. The launcher reads their JSON results, or raises
  ParallelError with each side's last word.

Timing: every generation starts after both sides have prefilled (a barrier), and each side stamps
its work with time.perf_counter (CLOCK_MONOTONIC on Linux: one clock for both processes); each
stamp follows a read of a result by the host (the draft's top-k, the target's accepted path), so
the GPU's work is inside it. The timeline of notebook 20 is these stamps.
"""

from __future__ import annotations

import collections
import contextlib
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

from course.core.impl import ROOT

from . import decoder, wire
from .sides import GROWTHS, DraftSide, TargetSide

SCHEDULES = ("parallel", "serial")
RECV = "recv"  # what a worker yields to wait for its next message
DEFAULT_STEPS = 2  # SwiftSpec's d: draft steps per round during verification
DEFAULT_GROWTH = "likely"  # how those steps pick their candidates (sides.GROWTHS)


class ParallelError(RuntimeError):
    """A two-process run that failed: the message says which side stopped and why."""


# --------------------------------------------------------------------------- the workers


class Timeline:
    """Stamps of each side's work: (side, what, round, start, end) with time.perf_counter."""

    def __init__(self):
        self.events: list[dict] = []

    @contextlib.contextmanager
    def span(self, side: str, what: str, round_: int):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.events.append({"side": side, "what": what, "round": round_, "start": start,
                                "end": time.perf_counter()})


def draft_rounds(side: DraftSide, steps: int, schedule: str, clock: Timeline) -> Generator:
    """The draft worker of SwiftSpec's Algorithm 1 (§3.1) on a started side: send SUBTREE(r), grow
    `steps` steps while the target verifies (parallel) and wait; on ACCEPTED re-root, grow until
    tree_size items can be sent (serial: and `steps` steps more, now on the critical path), send
    SUBTREE(r + 1); on STOP return. Records per round whether the next token's subtree was reused."""
    after_reroot = steps if schedule == "serial" else 0
    reused: list[bool] = []
    with clock.span("draft", "grow", 0):
        side.grow(after_reroot)
    r = 0
    while True:
        with clock.span("draft", "select", r):
            parents, tokens, q = side.subtree()
        yield wire.Subtree(r, parents, tokens, q)
        if schedule == "parallel":
            with clock.span("draft", "grow ahead", r):  # off the critical path: the target is verifying
                side.grow(steps, ahead=True)
        reply = yield RECV
        if reply.kind == wire.STOP:
            return reused
        with clock.span("draft", "re-root", r):
            reused.append(side.reroot(reply.path, reply.next_token) is not None)
        r += 1
        with clock.span("draft", "grow", r):
            side.grow(after_reroot)


def target_rounds(side: TargetSide, max_new_tokens: int, eos: int | None, clock: Timeline) -> Generator:
    """The target worker of Algorithm 1 on a started side: receive SUBTREE(r), verify it, commit,
    send STOP when max_new_tokens are out (or eos), else ACCEPTED(r). Returns (tokens, accepted
    draft tokens per round)."""
    new: list[int] = []
    accepted: list[int] = []
    while True:
        sub = yield RECV
        with clock.span("target", "verify", sub.round):
            path, nxt = side.verify(sub.parents, sub.tokens, sub.q)
        accepted.append(len(path) - 1)
        _, done = _finish(new, [sub.tokens[j] for j in path[1:]] + [nxt], max_new_tokens, eos)
        yield wire.Reply(wire.STOP if done else wire.ACCEPTED, sub.round, path, nxt)
        if done:
            return new, accepted


def _finish(new: list[int], emitted: list[int], max_new: int, eos: int | None) -> tuple[list[int], bool]:
    """Append emitted tokens up to max_new and the first EOS; (the tokens appended, finished?)."""
    taken = []
    for t in emitted:
        if len(new) + len(taken) >= max_new:
            break
        taken.append(t)
        if eos is not None and t == eos:
            break
    new.extend(taken)
    done = len(new) >= max_new or (eos is not None and bool(taken) and taken[-1] == eos)
    return taken, done


def run_lockstep(draft_worker: Generator, target_worker: Generator) -> tuple:
    """Both workers in this process: each runs until it waits for a message that has not been sent
    yet. The order of each side's own steps is the two-process order. Returns (draft's result,
    target's result)."""
    workers = {"draft": draft_worker, "target": target_worker}
    other = {"draft": "target", "target": "draft"}
    inbox: dict[str, collections.deque] = {name: collections.deque() for name in workers}
    pending = {name: next(worker) for name, worker in workers.items()}
    results: dict[str, object] = {}
    while len(results) < 2:
        moved = False
        for name, worker in workers.items():
            while name not in results:
                op = pending[name]
                if isinstance(op, str):  # RECV
                    if not inbox[name]:
                        break
                    value = inbox[name].popleft()
                else:
                    inbox[other[name]].append(op)
                    value = None
                moved = True
                try:
                    pending[name] = worker.send(value)
                except StopIteration as finished:
                    results[name] = finished.value
        if not moved:
            raise RuntimeError("both workers wait for a message: the protocol is stuck")
    return results["draft"], results["target"]


def run_linked(worker: Generator, link: wire.Link, clock: Timeline, role: str, with_q: bool):
    """One worker in its own process: sends go out through the link, waits are stamped."""
    what = "SUBTREE" if role == "target" else "ACCEPTED or STOP"
    op = next(worker)
    while True:
        if isinstance(op, str):  # RECV
            start = time.perf_counter()
            value = link.recv(what, with_q=with_q)
            clock.events.append({"side": role, "what": "wait", "round": value.round, "start": start,
                                 "end": time.perf_counter()})
        else:
            link.send(op)
            value = None
        try:
            op = worker.send(value)
        except StopIteration as finished:
            return finished.value


# --------------------------------------------------------------------------- one generation


@dataclasses.dataclass
class ParallelGeneration:
    """What one generation produced and cost (B = 1)."""

    tokens: list[int]
    seconds: float  # from both sides prefilled to the last verification
    target_calls: int
    draft_calls: int
    accepted: list[int]  # draft tokens accepted per round
    reused: list[bool]  # per re-root: the next token's subtree was in the draft tree
    events: list[dict]  # the timeline, times in seconds from the start
    mode: str
    schedule: str
    steps: int
    processes: int  # 1: lockstep in this process, 2: one process per side

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def tokens_per_call(self) -> float:
        """Tokens emitted per target call (accepted + 1, before the last round's truncation)."""
        return (sum(self.accepted) + len(self.accepted)) / len(self.accepted)

    def mean_ms(self, side: str, *whats: str) -> float:
        """Mean duration of a side's spans of these kinds (e.g. "target", "verify"), in ms."""
        spans = [e["end"] - e["start"] for e in self.events if e["side"] == side and e["what"] in whats]
        return 1e3 * sum(spans) / len(spans) if spans else 0.0

    def summary(self) -> str:
        where = "two processes" if self.processes == 2 else "one process"
        return (f"{self.schedule} tree generation ({self.mode}, d = {self.steps}, {where}): "
                f"{self.new_tokens} tokens in {self.seconds:.3f} s = {self.tokens_per_s:.1f} tokens/s, "
                f"{self.target_calls} target calls ({self.tokens_per_call:.2f} tokens per call), "
                f"{self.draft_calls} draft calls, "
                f"{sum(self.reused)} of {len(self.reused)} re-roots kept a subtree")


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _check_prompt(prompt, vocab_size: int) -> list[int]:
    prompts = decoder.check_prompts(prompt, vocab_size)
    if len(prompts) != 1:
        raise ValueError(f"parallel tree generation takes one prompt (B = 1), got {len(prompts)}")
    return prompts[0]


def check_pair(target_config, draft_config, target_dtype, draft_dtype) -> None:
    """A pair that cannot work together, refused before anything runs (wire.PairMismatch)."""
    problems = []
    if target_config.vocab_size != draft_config.vocab_size:
        problems.append(f"vocab_size: target {target_config.vocab_size}, draft {draft_config.vocab_size}")
    if target_dtype != draft_dtype:
        problems.append(f"dtype: target {str(target_dtype).replace('torch.', '')}, draft "
                        f"{str(draft_dtype).replace('torch.', '')}")
    if problems:
        raise wire.PairMismatch("the target and the draft do not match: " + "; ".join(problems))


def build_sides(target, draft, *, max_prompt: int, max_new_tokens: int, tree_size: int = 8, width: int = 2,
                steps: int = DEFAULT_STEPS, branch: int | None = None, mode: str = "greedy",
                backend: str = "kernels", impl: str | None = None, graphs: bool | None = None,
                growth: str = DEFAULT_GROWTH) -> tuple[DraftSide, TargetSide]:
    """Both sides for prompts of up to max_prompt tokens (checked: the pair, the settings); on a GPU
    their CUDA graphs are captured here, so build them once and `run_sides` many times."""
    cfg = decoder.settings(tree_size, width, branch, mode=mode)
    decoder._positive_int(max_new_tokens, "max_new_tokens")
    check_pair(target.config, draft.config, target.dtype, draft.dtype)
    sizes = dict(max_prompt=max_prompt, max_new_tokens=max_new_tokens, backend=backend, impl=impl,
                 graphs=graphs)
    return DraftSide(draft, cfg, steps, growth=growth, **sizes), TargetSide(target, cfg, **sizes)


@torch.no_grad()
def run_sides(sides: tuple[DraftSide, TargetSide], prompt, *, schedule: str = "parallel", seed: int = 0,
              eos: int | None = None) -> ParallelGeneration:
    """One generation with built sides, both workers in this process (lockstep, see the module
    docstring); the draft's generator starts from `seed`, the target's from seed + 1."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    d_side, t_side = sides
    prompt = _check_prompt(prompt, t_side.model.config.vocab_size)
    d_side.start(prompt, seed)
    t_side.start(prompt, seed + 1)
    _sync(t_side.model.device)
    clock = Timeline()
    t0 = time.perf_counter()
    reused, (tokens, accepted) = run_lockstep(draft_rounds(d_side, d_side.steps, schedule, clock),
                                              target_rounds(t_side, t_side.max_new_tokens, eos, clock))
    _sync(t_side.model.device)
    seconds = time.perf_counter() - t0
    return ParallelGeneration(tokens, seconds, t_side.calls, d_side.calls, accepted, reused,
                              _relative(clock.events, t0), d_side.cfg.mode, schedule, d_side.steps, 1)


def generate(target, draft, prompt, max_new_tokens: int, *, tree_size: int = 8, width: int = 2,
             steps: int = DEFAULT_STEPS, branch: int | None = None, mode: str = "greedy",
             schedule: str = "parallel", seed: int = 0, backend: str = "kernels", impl: str | None = None,
             eos: int | None = None, graphs: bool | None = None, growth: str = DEFAULT_GROWTH
             ) -> ParallelGeneration:
    """One generation, both workers in this process (lockstep, see the module docstring); one
    prompt (a token-id list). steps: SwiftSpec's d, draft steps per round (during verification, or
    after re-rooting for schedule="serial"). Greedy output equals the target's greedy decoding; the
    parallel schedule's tokens equal `launch`'s for the same settings. Builds the sides for this
    prompt: to run many, `build_sides` once and `run_sides`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    prompt = _check_prompt(prompt, target.config.vocab_size)
    sides = build_sides(target, draft, max_prompt=len(prompt), max_new_tokens=max_new_tokens,
                        tree_size=tree_size, width=width, steps=steps, branch=branch, mode=mode,
                        backend=backend, impl=impl, graphs=graphs, growth=growth)
    return run_sides(sides, prompt, schedule=schedule, seed=seed, eos=eos)


def _relative(events: list[dict], t0: float) -> list[dict]:
    return [dict(e, start=e["start"] - t0, end=e["end"] - t0) for e in events]


# --------------------------------------------------------------------------- two processes


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
        _check_prompt(run.prompt, t_config.vocab_size)
        if isinstance(run.steps, bool) or not isinstance(run.steps, int) or run.steps < 0:
            raise ValueError(f"runs[{i}].steps must be an int >= 0, got {run.steps!r}")
    if job.growth not in GROWTHS:
        raise ValueError(f"growth must be one of {GROWTHS}, got {job.growth!r}")
    if job.transport not in ("gloo", "nccl"):
        raise ValueError(f"transport must be 'gloo' or 'nccl', got {job.transport!r}")
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
                [sys.executable, "-m", "course.capstone.parallel", role, str(self.folder / "job.json"),
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
            events = _relative(t["events"] + d["events"], t["t0"])
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
    draft on cuda:1 in float16 through NCCL; in the simulator both on the CPU in float32 through gloo."""
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
                   devices={"target": "cuda:0", "draft": "cuda:1"}, transport="nccl")
        options = gpu | options
    return Job(str(paths["target"]), str(paths["draft"]), runs, **options)


def generate_report(texts, *, pair: str | None = None, max_new_tokens: int | None = None, tree_size: int = 8,
                    width: int = 2, steps: int = DEFAULT_STEPS, mode: str = "greedy", seed: int = 0,
                    backend: str = "kernels", impl: str | None = None) -> str:
    """What `python -m course generate --parallel` prints: the continuation, the parallel run's
    tokens/s and tokens per target call, and (greedy) whether it equals plain decoding; on a GPU
    also serial tree generation with the same code on one GPU, and the speed-up.

    Needs two GPUs on a GPU machine (one process and one GPU per model); in the simulator the two
    processes run on the CPU and talk through gloo (the tiny pair), which shows the protocol at
    work, not its speed."""
    from course.core import runtime

    from . import weights
    from .text import decode

    texts = [texts] if isinstance(texts, str) else list(texts)
    if len(texts) != 1:
        raise ValueError(f"--parallel takes one --prompt (B = 1), got {len(texts)}")
    if runtime.on_gpu() and torch.cuda.device_count() < 2:
        raise ValueError(f"--parallel runs the target and the draft on two GPUs, one process each, and "
                         f"this machine has {torch.cuda.device_count()}. On one GPU, `python -m course "
                         "generate` runs the serial tree decoder; tools/gpu_parallel.sh --one-gpu measures "
                         "both processes sharing one GPU")
    pair = pair or runtime.pick(sim="tiny", gpu="small")
    max_new_tokens = max_new_tokens if max_new_tokens is not None else runtime.pick(sim=12, gpu=64)
    prompt = decoder.check_texts(texts)[0]
    decoder.settings(tree_size, width, None, mode=mode)
    options = dict(tree_size=tree_size, width=width, max_new_tokens=max_new_tokens, backend=backend,
                   impl=impl)
    run = Run(prompt, steps, mode, seed)
    warm = [run] if runtime.on_gpu() else []  # Triton compiles on first use: a warm-up run, untimed
    got = launch(pair_job(pair, [*warm, run], **options))[-1]
    lines = [f"pair {pair} ({runtime.MODE}), mode {mode}, tree size {tree_size}, width {width}, d = {steps}",
             f"{texts[0]!r} -> {decode(got.tokens)!r}", got.summary()]
    device = "cuda:0" if runtime.on_gpu() else "cpu"
    dtype = torch.float16 if runtime.on_gpu() else torch.float32
    models = weights.load_pair(pair, device=device, dtype=dtype)
    if runtime.on_gpu():
        same = dict(tree_size=tree_size, width=width, steps=steps, mode=mode, seed=seed, backend=backend,
                    impl=impl)
        generate(models.target, models.draft, prompt, max_new_tokens, schedule="serial", **same)
        serial = generate(models.target, models.draft, prompt, max_new_tokens, schedule="serial", **same)
        lines += [serial.summary() + " (one GPU)",
                  f"parallel / serial: {got.tokens_per_s / serial.tokens_per_s:.2f}x tokens/s"]
    else:
        lines.append("(the simulator: two CPU processes talking through gloo; the times say nothing about "
                     "GPUs)")
    if mode == "greedy":
        plain = decoder.autoregressive(models.target, [prompt], max_new_tokens, backend=backend, impl=impl)
        lines.append(f"greedy output identical to plain decoding: {plain.tokens[0] == got.tokens}")
    return "\n".join(lines)


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
        link = wire.Link(rank, job.tree_size, config.vocab_size, device if group else "cpu", group=group,
                         nccl=group is not None, watchdog=watchdog)
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


def _side(job: Job, run: Run, role: str, model, built: dict):
    """This process's side for the run's (mode, d), built on first use for the job's longest prompt
    (on a GPU its graphs are captured then) and reused by the job's later runs."""
    key = (run.mode, run.steps)
    if key not in built:
        cfg = decoder.settings(job.tree_size, job.width, job.branch, mode=run.mode)
        sizes = dict(max_prompt=max(len(r.prompt) for r in job.runs), max_new_tokens=job.max_new_tokens,
                     backend=job.backend, impl=job.impl)
        built[key] = (DraftSide(model, cfg, run.steps, growth=job.growth, **sizes) if role == "draft"
                      else TargetSide(model, cfg, **sizes))
    return built[key]


@torch.no_grad()
def _one_run(job: Job, run: Run, role: str, model, link: wire.Link, folder: Path, built: dict) -> dict:
    import torch.distributed as dist

    side = _side(job, run, role, model, built)
    side.start(run.prompt, run.seed if role == "draft" else run.seed + 1)
    _sync(model.device)
    dist.barrier()  # both sides prefilled: the clock starts together
    clock = Timeline()
    t0 = time.perf_counter()
    if role == "draft":
        worker = draft_rounds(side, run.steps, "parallel", clock)
    else:
        worker = target_rounds(side, job.max_new_tokens, job.eos, clock)
    if job.pause:
        worker = _pausing(worker, job, role, folder)
    result = run_linked(worker, link, clock, role, with_q=run.mode == "sample")
    _sync(model.device)
    seconds = time.perf_counter() - t0
    if role == "draft":
        return {"draft_calls": side.calls, "reused": result, "events": clock.events}
    tokens, accepted = result
    return {"tokens": tokens, "accepted": accepted, "target_calls": side.calls, "seconds": seconds, "t0": t0,
            "events": clock.events}


if __name__ == "__main__":  # a worker process of `launch`: role, job file, folder, port
    import course  # noqa: F401  (first: GPU or simulator)

    sys.exit(_worker(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
