"""SwiftSpec's Algorithm 1 (§3.1) with the capstone's models: the two workers of parallel tree
generation and the two ways to run them (notebook 20).

Each worker is a generator over one side of `course.capstone.sides`: it yields each message it
sends (`wire.Subtree`, `wire.Reply`) and RECV where it waits for one, so the protocol is written
once and runs both in one process (`run_lockstep`, what `course.capstone.parallel.generate` does)
and in two (`run_linked`, one side per process: `course.capstone.processes`). The messages and
their order are `pyspec_ref.parallel_tree`'s.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Generator

from . import wire
from .sides import DraftSide, TargetSide

RECV = "recv"  # what a worker yields to wait for its next message


class Timeline:
    """Stamps of each side's work: (side, what, round, start, end) with time.perf_counter; a span's
    body may add what it measured inside (the target's pass on the GPU: "gpu_ms")."""

    def __init__(self):
        self.events: list[dict] = []

    @contextlib.contextmanager
    def span(self, side: str, what: str, round_: int):
        event = {"side": side, "what": what, "round": round_, "start": time.perf_counter()}
        try:
            yield event
        finally:
            event["end"] = time.perf_counter()
            self.events.append(event)


def draft_rounds(side: DraftSide, steps: int, schedule: str, clock: Timeline, critical: int = 0) -> Generator:
    """The draft worker of SwiftSpec's Algorithm 1 (§3.1) on a started side: send SUBTREE(r), grow
    `steps` steps while the target verifies (parallel, queued) and wait; on ACCEPTED re-root, grow
    until tree_size items can be sent and then take `critical` steps (serial: `steps`), now on the
    critical path, send SUBTREE(r + 1); on STOP return. The queued schedule sends SUBTREE(r + 1)
    right after the re-root, with no pass (`pyspec_ref.parallel_tree`'s module docstring). Records
    per round whether the next token's subtree was reused (`simulate_parallel_tree`'s rounds)."""
    after_reroot = steps if schedule == "serial" else critical
    reused: list[bool] = []
    with clock.span("draft", "grow", 0):
        side.grow(after_reroot)
    r = 0
    while True:
        with clock.span("draft", "select", r):
            parents, tokens, q = side.subtree()
        yield wire.Subtree(r, parents, tokens, q)
        if schedule != "serial":
            with clock.span("draft", "grow ahead", r):  # off the critical path: the target is verifying
                side.grow(steps, ahead=True)
        reply = yield RECV
        if reply.kind == wire.STOP:
            return reused
        with clock.span("draft", "re-root", r):
            reused.append(side.reroot(reply.path, reply.next_token, owe=schedule == "queued") is not None)
        r += 1
        if schedule != "queued":
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
        with clock.span("target", "verify", sub.round) as event:
            path, nxt = side.verify(sub.parents, sub.tokens, sub.q)
            event["gpu_ms"] = side.pass_ms
        accepted.append(len(path) - 1)
        _, done = finish(new, [sub.tokens[j] for j in path[1:]] + [nxt], max_new_tokens, eos)
        yield wire.Reply(wire.STOP if done else wire.ACCEPTED, sub.round, path, nxt)
        if done:
            return new, accepted


def finish(new: list[int], emitted: list[int], max_new: int, eos: int | None) -> tuple[list[int], bool]:
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

