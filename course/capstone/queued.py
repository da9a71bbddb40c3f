"""Parallel tree generation whose hosts only launch (notebook 20, §8): the queued schedule of
`pyspec_ref.parallel_tree`, its messages kept as device tensors.

In the other runs of the two workers (`protocol`, lockstep or one process per side) every message
goes through a host: the target's host reads the verdict before it replies, the draft's host reads
the re-root's counts before it can top the tree up, then the subtree before it can send it. Each
read waits for a GPU, and the next launch then waits for the host. Here each side works on a CUDA
stream of its own (both on one GPU, or one GPU each in this one process) and a round is:

  draft   ... its growth ahead | waits for ACCEPTED | the re-root (a graph) | the selection of
          tree_size items, padded when the tree holds fewer (a graph) | the packet copied into the
          target's inbox: SUBTREE sent
  target  waits for SUBTREE | one graph: the pass's inputs from the packet (`DeviceTree.packet`:
          tokens, depths, DFS times), the pass, verification (greedy, or SpecInfer's speculative
          sampling), the accepted rows' compaction, the reply and the commit | the reply copied
          into the draft's inbox: ACCEPTED sent

A send is a device-to-device copy followed by a CUDA event, and a receive is a stream waiting on that
event: the GPUs order the rounds by themselves, and the target's loop has no host in it. The queued
schedule is what makes that possible: between the verdict and the next SUBTREE the draft runs no
pass, so nothing there depends on a number only the host could choose. The draft's host still
reads five numbers a round, after the SUBTREE is on its way: the re-root's four counts, for the
widths of the passes it then queues for the growth ahead (its mirror of the counts, as in
`device_side`), and the committed prefix, for the tokens committed so far.
So it sits in the draft's loop only, where the growth ahead hides it.

The host learns that max_new_tokens are out one round late: by then it has queued one more
verification, whose tokens are dropped (its time is not counted). So the target's side needs room
for tree_size more tokens than a run asks for (`QueuedSides.run` checks). In sampling mode SUBTREE
also carries each item's draft distribution q (tree_size x V float32, copied into the target's
pass), and both sides take their uniforms from pools their hosts fill ahead (`UniformPool`), so a
sampling round launches as a greedy one does; for the same seeds the rounds are the lockstep
queued schedule's, token for token.

The hosts launch rounds ahead of the GPUs, so their clocks cannot say when a span ran. A run with
timeline=True stamps each side's spans with CUDA events on its own stream (`_StreamClock`): the
target's wait between two verifications and a message's way are read from those (notebook 20,
`tools/queued_timeline.py`).
"""

from __future__ import annotations

import contextlib
import time

import torch

from . import parallel
from .device_side import DeviceDraftSide
from .side_steps import HEAD
from .sides import TargetSide, _Verification


class _Link:
    """The two streams and the events that order them: on the CPU, no streams, and every call runs
    at once in program order, which is the order the events impose."""

    def __init__(self, draft_device: torch.device, target_device: torch.device):
        self.gpu = draft_device.type == "cuda"
        self.devices = len({draft_device, target_device})
        if self.gpu:
            self.streams = {"draft": torch.cuda.Stream(draft_device),
                            "target": torch.cuda.Stream(target_device)}
            self.events = {name: torch.cuda.Event() for name in ("subtree", "accepted", "read")}

    def on(self, side: str):
        return torch.cuda.stream(self.streams[side]) if self.gpu else contextlib.nullcontext()

    def send(self, what: str, side: str) -> None:
        """Mark the message just copied, on the sender's stream."""
        if self.gpu:
            self.events[what].record(self.streams[side])

    def receive(self, what: str, side: str) -> None:
        """The receiver's stream waits for the message (queued on the device: the host goes on)."""
        if self.gpu:
            self.streams[side].wait_event(self.events[what])

    def wait(self, what: str) -> None:
        """The host waits for an event (the draft's read)."""
        if self.gpu:
            self.events[what].synchronize()

    def drain(self) -> None:
        if self.gpu:
            for stream in self.streams.values():
                stream.synchronize()


class _StreamClock:
    """The queued rounds' timeline (`protocol.Timeline`'s spans: side, what, round, start, end),
    stamped where each side's stream is, not where its host is: the host launches rounds ahead of
    the GPUs, so its own clock says nothing of when a span ran. On a GPU a span is two CUDA events
    recorded on the side's stream (a receive's span, "wait", ends when the stream's wait is over),
    read after the run against an event each stream recorded at the start; on the CPU, where every
    call runs when it is made, the host's clock. Off (`on=False`) it records nothing and costs
    nothing on the GPUs."""

    def __init__(self, link: _Link, on: bool):
        self.link, self.on = link, on
        self.marks: list[tuple] = []  # (side, what, round, start, end): events, or perf_counter times
        self.zero: dict = {}

    def _now(self, side: str):
        if not self.link.gpu:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.link.streams[side])
        return event

    def start(self) -> None:
        """Time 0 on both streams. One GPU (or the CPU) has one clock: one zero for both sides. Two
        GPUs have one each: a zero recorded on each, with both streams idle, so the two are the
        same moment up to the few microseconds between the two records."""
        if not self.on:
            return
        if self.link.gpu and self.link.devices == 2:
            self.zero = {side: self._now(side) for side in ("draft", "target")}
        else:
            self.zero = dict.fromkeys(("draft", "target"), self._now("draft"))

    @contextlib.contextmanager
    def span(self, side: str, what: str, round_: int):
        if not self.on:
            yield
            return
        start = self._now(side)
        yield
        self.marks.append((side, what, round_, start, self._now(side)))

    def events(self) -> list[dict]:
        """The spans in seconds from time 0 (call after the streams are drained); a verification on
        a GPU carries its own span as gpu_ms too, the target's pass as `sides.TargetSide` times it."""
        out = []
        for side, what, round_, start, end in self.marks:
            event = {"side": side, "what": what, "round": round_}
            if self.link.gpu:
                zero = self.zero[side]
                event.update(start=zero.elapsed_time(start) / 1e3, end=zero.elapsed_time(end) / 1e3)
                if what == "verify":
                    event["gpu_ms"] = start.elapsed_time(end)
            else:
                event.update(start=start - self.zero[side], end=end - self.zero[side])
            out.append(event)
        return out


class QueuedTarget:
    """The target's round as one graph (see the module docstring): inbox (5 * tree_size,), the
    packet; reply (2 + tree_size,), [accepted path length, next token, path], the layout of
    `DeviceDraftSide.reply`; the committed prefix and the emitted tokens stay on the device."""

    def __init__(self, side: TargetSide, graphs: bool):
        n = side.cfg.tree_size
        device = side.cache.data.device
        i64 = dict(dtype=torch.int64, device=device)
        self.side, self.n = side, n
        self.inbox = torch.zeros(5 * n, **i64)
        self.inbox.copy_(chain_packet(n))  # valid contents for the capture's warm-up
        self.prefix = torch.zeros(1, **i64)
        self.reply = torch.zeros(2 + n, **i64)
        self.out = torch.zeros(side.max_new_tokens + 2 * n + 1, **i64)  # the last slot: trash
        self.count = torch.zeros(1, **i64)
        self.slots = torch.arange(n, **i64)
        self.verification = _Verification(side, n, graphed=False)
        # The packed vector's parts that never change: the tree's length and the queries' tree rows.
        packed = self.verification.step.packed
        packed[1] = n
        packed[HEAD + 2 * n:HEAD + 3 * n].copy_(self.slots)
        self.round = _graphed(self._body) if graphs else self._body
        if side.uniforms is not None:
            side.uniforms.restart()  # the capture above moved the device's cursor

    def start(self, prompt: list[int], seed: int) -> None:
        self.side.start(prompt, seed)  # in sampling mode, also the uniforms from the seed again
        self.prefix.fill_(self.side.prefix)
        self.count.zero_()

    @property
    def q(self) -> torch.Tensor | None:
        """Sampling: where SUBTREE's draft distributions go, the pass's own q (tree_size, V)."""
        return self.verification.q[0] if self.side.cfg.mode == "sample" else None

    def launch(self) -> None:
        """The round's graph, its sampling uniforms reserved first (on the host, as `TargetSide`)."""
        if self.side.uniforms is not None:
            self.side.uniforms.reserve(2)
        self.round()

    def _body(self) -> None:
        """The packet into the pass's packed vector (`side_steps.TreeStep`'s layout, W = T = n), the
        pass and the verification (`sides._Verification`), then the reply and the commit."""
        n, packed, inbox = self.n, self.verification.step.packed, self.inbox
        tokens = inbox[n:2 * n]
        times = inbox[3 * n:]  # start, end: the queries' intervals, and the same for their rows
        packed[0:1].copy_(self.prefix)
        packed[HEAD:HEAD + 2 * n].copy_(inbox[n:3 * n])  # tokens, depths
        packed[HEAD + 3 * n:HEAD + 5 * n].copy_(times)
        packed[HEAD + 5 * n:HEAD + 7 * n].copy_(times)
        # The verifier's parents and tokens: padding has no parent, so no walk from the root reaches it.
        packed[HEAD + 7 * n:].copy_(inbox[:2 * n])
        result = self.verification.step._body()
        path, nxt = result[:n], result[n:]
        accepted = (path >= 0).sum().reshape(1)
        self.reply[0:1].copy_(accepted)
        self.reply[1:2].copy_(nxt)
        self.reply[2:].copy_(path)
        # Emitted: the accepted nodes' tokens after the root, then the next token.
        after_root = torch.cat([path[1:], path[:1] * 0 - 1])
        emitted = torch.where(after_root >= 0, tokens.gather(0, after_root.clamp(min=0)), nxt)
        at = torch.where(self.slots < accepted, self.count + self.slots, self.out.numel() - 1)
        self.out.scatter_(0, at, emitted)
        self.count += accepted
        self.prefix += accepted


def chain_packet(n: int) -> torch.Tensor:
    """A valid packet of n items (a chain of token 0): the capture's warm-up runs on it."""
    ids = list(range(n))
    return torch.tensor([-1, *ids[:-1], *[0] * n, *ids, *ids, *[n - 1] * n], dtype=torch.int64)


def _graphed(body):
    from course.measure.timing import graphed

    return graphed(body)


def on_device(device: torch.device):
    """Work on `device` (kernels, graph captures, streams): a GPU's context, or nothing."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def build(target, draft, *, max_prompt: int, max_new_tokens: int, **settings) -> QueuedSides:
    """Both sides for the queued rounds, each built on its model's device (one GPU, or one each),
    with room for runs of up to max_new_tokens; settings: `parallel.build_sides`'s (the device
    tree)."""
    tree_size = settings.get("tree_size", 8)
    sizes = dict(max_prompt=max_prompt, max_new_tokens=max_new_tokens + tree_size, **settings)
    with on_device(draft.device):
        draft_side, _ = parallel.build_sides(target, draft, only="draft", **sizes)
    with on_device(target.device):
        _, target_side = parallel.build_sides(target, draft, only="target", **sizes)
    return QueuedSides((draft_side, target_side))


class QueuedSides:
    """Both sides of the queued schedule, built once (on a GPU, the target's round is captured
    here; the draft's graphs are `DeviceDraftSide`'s): `run(prompt, max_new_tokens)` many times.
    sides: as `build` makes them (the device tree, max_new_tokens at least tree_size more than any
    run asks for)."""

    def __init__(self, sides: tuple[DeviceDraftSide, TargetSide]):
        draft, target = sides
        if not isinstance(draft, DeviceDraftSide):
            raise ValueError("the queued rounds need the draft's tree on the device (draft_tree='device')")
        self.draft = draft
        self.devices = {"draft": draft.cache.data.device, "target": target.cache.data.device}
        if len({device.type for device in self.devices.values()}) > 1:
            raise ValueError(f"the sides are on {self.devices['draft']} (draft) and {self.devices['target']} "
                             "(target): the queued rounds run both on GPUs or both on the CPU")
        with on_device(self.devices["target"]):
            self.target = QueuedTarget(target, graphs=target.graphs)
        self.link = _Link(self.devices["draft"], self.devices["target"])
        self.n = draft.cfg.tree_size
        on_gpu = self.link.gpu
        self.read = torch.zeros(5, dtype=torch.int64, pin_memory=on_gpu)  # rows, nodes, owed, found, prefix

    def run(self, prompt, max_new_tokens: int, *, seed: int = 0, eos: int | None = None,
            timeline: bool = False) -> parallel.ParallelGeneration:
        """One generation (B = 1): greedy output equals the target's greedy decoding; the draft's
        generator starts from `seed`, the target's from seed + 1 (as `parallel.run_sides`).
        timeline: stamp each side's spans on its stream (`_StreamClock`) into the generation's
        events, for the target's wait between two verifications and the picture of the rounds; off,
        the run records none (as the bench's timed runs)."""
        draft, target, link, n = self.draft, self.target, self.link, self.n
        room = target.side.max_new_tokens - n
        if (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
                or not 1 <= max_new_tokens <= room):
            raise ValueError(f"max_new_tokens must be an int in [1, {room}]: these sides were built for "
                             f"{target.side.max_new_tokens}, and the queued rounds need room for one more "
                             f"verification of tree_size = {n}; got {max_new_tokens!r}")
        prompt = parallel.check_prompt(prompt, target.side.model.config.vocab_size)
        with on_device(self.devices["draft"]):
            draft.start(prompt, seed)
        with on_device(self.devices["target"]):
            target.start(prompt, seed + 1)
        for device in self.devices.values():
            parallel.sync(device)
        clock = _StreamClock(link, on=timeline)
        clock.start()
        began = time.perf_counter()
        with link.on("draft"), clock.span("draft", "grow", 0):
            draft.grow(0)
        self._send_subtree(clock, 0)
        self._verify(clock, 0)
        committed, accepted, reused = 0, [], []
        while committed < max_new_tokens:
            r = len(accepted)
            with link.on("draft"):
                with clock.span("draft", "grow ahead", r):
                    draft.grow(draft.steps, ahead=True)
                with clock.span("draft", "wait", r):
                    link.receive("accepted", "draft")
                with clock.span("draft", "re-root", r):
                    info = draft._reroot()
            self._send_subtree(clock, r + 1)
            with link.on("draft"):
                self.read[:4].copy_(info, non_blocking=True)
                self.read[4:].copy_(draft.tree.prefix, non_blocking=True)
                link.send("read", "draft")
            self._verify(clock, r + 1)  # queued before the host waits: the target's loop never waits for it
            link.wait("read")
            rows, nodes, owed, found, prefix = self.read.tolist()
            k1 = prefix - draft.prefix
            draft.rerooted(rows, nodes, owed, found, k1)
            committed += k1
            accepted.append(k1 - 1)
            reused.append(bool(found))
        seconds = time.perf_counter() - began  # every token is committed: the last verification is spare
        link.drain()
        with on_device(self.devices["target"]):
            tokens = target.out[:max_new_tokens].tolist()
        if eos is not None and eos in tokens:
            tokens = tokens[:tokens.index(eos) + 1]
        return parallel.ParallelGeneration(tokens, seconds, len(accepted), draft.calls, accepted, reused[:-1],
                                           clock.events(), draft.cfg.mode, "queued", draft.steps, 1)

    def _send_subtree(self, clock: _StreamClock, r: int) -> None:
        """On the draft's stream: the selection, its packet (and q) into the target's inbox, SUBTREE
        sent."""
        with self.link.on("draft"):
            with clock.span("draft", "select", r):
                _, q = self.draft._select()
                self.target.inbox.copy_(self.draft.tree.packet(self.n))
                if q is not None:
                    self.target.q.copy_(q)
            self.link.send("subtree", "draft")

    def _verify(self, clock: _StreamClock, r: int) -> None:
        """On the target's stream: receive SUBTREE, the round's graph, the reply into the draft's
        inbox, ACCEPTED sent."""
        link, target = self.link, self.target
        with link.on("target"):
            with clock.span("target", "wait", r):
                link.receive("subtree", "target")
            with clock.span("target", "verify", r):
                target.launch()
                self.draft.reply.copy_(target.reply)
            link.send("accepted", "target")
