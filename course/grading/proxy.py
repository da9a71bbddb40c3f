"""The grader's side of a grading child: a module whose kernels run in the sandbox.

A check calls `cases(module, seed)` with a module and compares what the module's functions
return with the oracle. Grading hands it a `ProxyModule`: its constants, classes and host-only
helpers are the grader's own (the solution module's: so a case's sizes, such as MASK_TILE, are
the grader's), and every function that runs an exercise's code (`remote_names`: those whose
body holds a hole, and, transitively, whatever calls one, across lesson modules) is forwarded
to the child: the arguments go over as plain values and raw tensor bytes (`course.grading.wire`;
a tensor a check watches for reads of more than a block at once, `course.core.blockread`, goes as
plain bytes with a mark, and the child watches its copy), the child runs the graded module's
function, and the grader builds the outputs itself from the reply, checking every size against
its limits (each output a contiguous tensor alone in memory of exactly its size, so the grader
never builds more than the bytes that came; and, where its own launcher run dry says which, of
exactly the dtypes and shapes the call makes: course.grading.shapes), then copies back into its
own tensors what the call changed in them (in-place launchers). The child never sees
the seed, the expected outputs, the tolerances or the checks.

A reply the grader cannot read is a failed case (`ReplyError`, with a short note; the child is
restarted for the next call). A child that dies, hangs or passes a limit ends the exercise
(`ChildGone`, raised through the check: the runner scores the exercise zero, as a crash).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import re
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch

from ..core import blockread
from . import sandbox, services, shapes, wire

STARTUP_S = 180.0
SHORT = 1000  # characters of a child's error message kept in the feedback
# Exceptions a check may catch by type (a launcher's refusal), rebuilt as such; anything else
# becomes a RemoteError with the child's type name in its message.
REBUILT = {name: getattr(builtins, name) for name in (
    "ValueError", "TypeError", "IndexError", "KeyError", "RuntimeError", "ZeroDivisionError",
    "AssertionError", "NotImplementedError", "OverflowError", "FloatingPointError", "ArithmeticError",
    "AttributeError", "NameError", "UnboundLocalError", "MemoryError", "RecursionError", "LookupError")}


class ChildGone(BaseException):  # noqa: N818  (not an error of the check: it ends the exercise)
    """The child died, hung or passed a limit; `why` says which ("crashed", "timeout", ...)."""

    def __init__(self, why: str, detail: str = ""):
        super().__init__(why, detail)
        self.why, self.detail = why, detail


class ReplyError(RuntimeError):
    """The child's reply could not be read: a failed case."""


class InputChanged(RuntimeError):
    """A call changed a tensor it was given, and its launcher is not one that works in place: a
    failed case (a check that computes its reference from the inputs after the call must see the
    inputs it made)."""


# The launchers that change their tensor arguments in place, as their solutions document it
# (tests/test_grade_splice.py keeps this in step with the docstrings). The grader copies what
# such a call changed back into its own tensors; any other call that changes one fails the case.
IN_PLACE = {"swiftspec": {"compact"}}


class RemoteError(RuntimeError):
    """An exception of a type checks do not catch, raised in the child."""


class ModuleBroken(BaseException):  # noqa: N818
    """The graded module could not be imported in the child (a failed import ends the exercise)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


# ------------------------------------------------------------------------------------ the channel

class Channel:
    """One submission's child, started on first use and again after it was stopped."""

    def __init__(self, spawn: Callable[[], sandbox.Child], limits: wire.WireLimits,
                 device_ok: Callable[[str], bool], cleaned: Callable[[str], str] = lambda text: text):
        self.spawn, self.limits, self.device_ok, self.cleaned = spawn, limits, device_ok, cleaned
        self.child: sandbox.Child | None = None
        self.deadline = float("inf")  # wall-clock: the backstop for a child that waits without computing
        self.cpu_budget = float("inf")  # CPU seconds the exercise may use, all its children together
        self.cpu_spent = 0.0  # by the exercise's children stopped so far
        self.cpu_base = 0.0  # the running child's CPU time when the exercise's count began for it
        self.unreadable = ""  # set by a reply the grader could not read: the exercise's later calls fail too

    def start_exercise(self, cpu_budget: float, deadline: float) -> None:
        """The exercise's limits: `cpu_budget` seconds of the submission's own CPU time (its processes
        together: `sandbox.Child.cpu_seconds`), and a wall-clock `deadline` for a child that waits."""
        self.deadline, self.cpu_budget, self.cpu_spent, self.unreadable = deadline, cpu_budget, 0.0, ""
        if self.child is not None and not self.child.closed:
            self._arm(self.child)

    def _arm(self, child: sandbox.Child) -> None:
        """Count the exercise's CPU time on this child from now: it is stopped past the budget."""
        self.cpu_base = child.cpu_seconds()
        child.cpu_limit = self.cpu_base + max(0.0, self.cpu_budget - self.cpu_spent)

    def exercise_cpu(self) -> float:
        """The CPU time the exercise used so far (its children's, the start-ups excluded)."""
        child = self.child
        running = child.cpu_seconds() - self.cpu_base if child is not None and not child.closed else 0.0
        return self.cpu_spent + max(0.0, running)

    def _ensure(self) -> sandbox.Child:
        """The running child, or a fresh one. Starting one (importing torch and the harness) has a
        budget of its own, STARTUP_S, and does not count against the exercise's time limit."""
        if self.child is not None and not self.child.closed:
            return self.child
        started = time.monotonic()
        self.child = self.spawn()
        try:
            header, _ = self._read(started + STARTUP_S)
        except ReplyError as error:
            self.stop()
            raise ChildGone("garbled", str(error)) from None
        if header.get("op") != "ready":
            self.stop()
            raise ChildGone("garbled", "the child did not start as expected")
        self.deadline += time.monotonic() - started
        self._arm(self.child)
        return self.child

    def stop(self) -> None:
        child = self.child
        if child is not None and not child.closed:
            self.cpu_spent += max(0.0, child.cpu_seconds() - self.cpu_base)
            child.close()

    def _read(self, deadline: float) -> tuple[dict, bytes]:
        child = self.child
        try:
            return wire.read_frame(child.replies, self.limits, deadline, child.tick)
        except TimeoutError:  # the wall-clock backstop: CPU time limits are the child's own (tick)
            raise ChildGone("waited") from None
        except EOFError:
            raise self._gone() from None
        except (wire.WireError, OSError) as error:
            child.tick()
            if child.over:
                raise ChildGone(child.over) from None
            self.stop()
            raise ReplyError(f"the grading process sent a reply grading cannot read ({error})") from None

    def _send(self, data: bytes) -> None:
        child = self.child
        try:
            wire.write_all(child.requests, data)
        except OSError:  # it closed its end
            raise self._gone() from None

    def _gone(self) -> ChildGone:
        """Why the child closed its end of the channel: it ended (how), or it closed it and lives on."""
        child = self.child
        if child.over:
            return ChildGone(child.over)
        try:
            child.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001  (subprocess.TimeoutExpired: it closed the channel but runs on)
            child.close()
            return ChildGone("garbled", "it closed the channel")
        return ChildGone("memory" if child.out_of_memory() else "ended", str(child.returncode))

    def request(self, message: dict, values: dict, name_of=lambda obj: None, callbacks: dict | None = None,
                resolve: Callable[[str], type | None] = lambda name: None,
                read: Callable = lambda header, decoder: (header, decoder), scope: str = services.TIMING):
        """Send one request, serve the child's callbacks and services (course.grading.services, for
        `scope`: the lesson module called, or timing) meanwhile, and return read(header, decoder)
        of its answer. After a reply it could not read, the grader stops the child and fails the
        exercise's later calls at once (a fresh child per call would only spend the time limit)."""
        if self.unreadable:
            raise ReplyError(self.unreadable)
        try:
            self._ensure()
            try:
                frame = wire.frame(message, name_of, **values)
            except TypeError as error:
                raise ReplyError(f"grading cannot send this call's arguments: {error}") from None
            self._send(frame)
            while True:
                header, blob = self._read(self.deadline)
                decoder = wire.Decoder(header, blob, resolve, self.device_ok)
                if header.get("op") == "service":
                    self._serve_service(header, decoder, scope)
                elif header.get("op") == "callback":
                    self._serve_callback(header, decoder, callbacks or {}, name_of)
                else:
                    return read(header, decoder)
        except ReplyError as error:
            self.stop()
            self.unreadable = f"{error} (and so every later call of this exercise)"
            raise

    def _serve_service(self, header: dict, decoder: wire.Decoder, scope: str) -> None:
        """Run what the child's launch code asked of the specification, here; its error goes back."""
        try:
            args = decoder.decode(header.get("args"))
            kwargs = decoder.decode(header.get("kwargs"))
            if not isinstance(args, list) or not isinstance(kwargs, dict) or not all(
                    isinstance(k, str) for k in kwargs):
                raise services.Refused("a service's arguments must be a list and keywords")
            result = services.run(header.get("name"), scope, args, kwargs)
            reply = wire.frame({"op": "service_done"}, result=result)
        except wire.WireError as error:
            reply = wire.frame({"op": "service_failed", "kind": "RuntimeError", "message": str(error)[:300]})
        except Exception as error:  # noqa: BLE001  (the validator's refusal goes back as its type)
            reply = wire.frame({"op": "service_failed", "kind": type(error).__name__,
                                "message": str(error)[:2000]})
        self._send(reply)

    def _serve_callback(self, header: dict, decoder: wire.Decoder, callbacks: dict, name_of) -> None:
        stand_in = callbacks.get(header.get("name"))
        try:
            args = decoder.decode(header.get("args"))
            kwargs = decoder.decode(header.get("kwargs"))
            if stand_in is None or not isinstance(args, list) or not isinstance(kwargs, dict) \
                    or not all(isinstance(k, str) for k in kwargs):
                raise ReplyError("a callback the grader did not offer")
        except (wire.WireError, ReplyError) as error:
            self._send(wire.frame({"op": "callback_failed", "message": str(error)[:200]}))
            return
        try:
            stand_in[None](*args, **kwargs)
        except Exception as error:  # noqa: BLE001  (the stand-in's failure goes back as text)
            why = f"{type(error).__name__}: {error}"[:300]
            self._send(wire.frame({"op": "callback_failed", "message": why}))
            return
        self._send(wire.frame({"op": "callback_done"}, name_of, after=blockread.tensors_in((args, kwargs))))

    def call(self, module: str, name: str, args: tuple, kwargs: dict, name_of, resolve,
             callbacks: dict[str, Callable], outputs: list | None = None, blocks: list | None = None):
        """Run lessons.<module>.<name> in the child; `outputs`, the [(dtype, shape)] the grader's own
        launcher makes (course.grading.shapes), is what the reply must hold, checked before any of
        its tensors is built; `blocks`, [position, block] of each argument the child must watch for
        reads of more than a block at once (course.core.blockread.lift)."""
        def answer(header: dict, decoder: wire.Decoder):
            if "error" in header:
                return self._error(header)
            if outputs is not None and header.get("result_is") is None:
                _require_outputs(header.get("result"), outputs, name)
            try:
                decoder.strict = True  # the outputs: each a contiguous tensor of its own
                result = decoder.decode(header.get("result"))
                decoder.strict = False  # the arguments after the call: checked against the grader's own
                after = decoder.decode(header.get("after"))
            except wire.WireError as error:
                raise ReplyError(f"the grading process sent a reply grading cannot read ({error})") from None
            given = blockread.tensors_in((list(args), kwargs))
            _copy_back(given, after, name in IN_PLACE.get(module, ()), name)
            same = header.get("result_is")
            if same is not None:  # it returned an argument itself: the grader's own tensor
                if not wire.is_int(same) or not 0 <= same < len(given):
                    raise ReplyError("the grading process named an argument that is not there")
                return given[same]
            return result

        outcome = self.request({"op": "call", "module": module, "name": name, "callbacks": sorted(callbacks),
                                "blocks": blocks or []},
                               {"args": list(args), "kwargs": kwargs}, name_of, callbacks, resolve, answer,
                               scope=module)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def time(self, spec: list[str]) -> tuple[float | None, str]:
        header, _ = self.request({"op": "time", "hook": spec}, {})
        ms, note = header.get("ms"), header.get("note")
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and 0 < ms < 1e7:
            return float(ms), ""
        return None, self.cleaned(note)[:300] if isinstance(note, str) and note else "no time came back"

    def _error(self, header: dict) -> BaseException:
        from course.core.crash import Crash
        from course.core.stubs import ExerciseNotImplemented

        error = header.get("error")
        if not isinstance(error, dict):
            return ReplyError("the grading process sent an error grading cannot read")
        text = {key: self.cleaned(str(error.get(key, "")))[:SHORT] for key in
                ("kind", "message", "thread", "place", "source", "access")}
        kind = text["kind"] if re.fullmatch(r"[A-Za-z_][\w.]{0,80}", text["kind"]) else "Exception"
        if header.get("import"):
            return ModuleBroken(f"{kind}: {text['message']}")
        if kind == "ExerciseNotImplemented":
            return ExerciseNotImplemented(text["message"])
        message = text["message"] if kind in REBUILT else f"{kind}: {text['message']}"
        raised = REBUILT.get(kind, RemoteError)(message)
        raised.remote_crash = Crash(kind, text["message"], text["thread"], text["place"], text["source"],
                                    text["access"], f"{kind}: {text['message']}")
        return raised


def _require_outputs(result, outputs: list, name: str) -> None:
    """ReplyError unless the reply's tensors are, in order, of the dtypes and shapes the call makes."""
    want = [(wire.DTYPE_NAMES[dtype], list(shape)) for dtype, shape in outputs]
    got = wire.tensor_specs(result)
    if got != want:
        def said(specs):
            return ", ".join(f"{dtype} {tuple(shape) if isinstance(shape, list) else shape}"
                             for dtype, shape in specs[:6]) or "none"
        raise ReplyError(f"the reply's outputs are not the ones {name} makes: it sent {said(got)[:300]}, "
                         f"where the course's launcher returns {said(want)}")


def _copy_back(mine: list[torch.Tensor], theirs, in_place: bool, name: str) -> None:
    """What an in-place call changed in its tensor arguments, into the grader's own tensors; for any
    other call, InputChanged if it changed one."""
    if not isinstance(theirs, list) or len(theirs) != len(mine):
        raise ReplyError("the grading process sent back a different number of arguments")
    for number, (own, back) in enumerate(zip(mine, theirs, strict=True), start=1):
        if not isinstance(back, torch.Tensor) or back.shape != own.shape or back.dtype != own.dtype:
            raise ReplyError("the grading process sent back an argument of another shape or dtype")
        back = back.to(own.device)
        if torch.equal(own, back) or (own.is_floating_point() and _same_with_nans(own, back)):
            continue
        if not in_place:
            raise InputChanged(f"{name} changed tensor argument {number} (shape {tuple(own.shape)}) in "
                               "place: it must leave its inputs as they were")
        own.copy_(back)


def _same_with_nans(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


# ------------------------------------------------------------------------------------ the module

class RemoteFunction:
    """A module function that runs an exercise's code: each call runs in the child."""

    def __init__(self, proxy: ProxyModule, name: str):
        self.proxy, self.__name__ = proxy, name
        self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        return self.proxy._call(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<{self.proxy.__name__}.{self.__name__}, graded in the sandbox>"


class RemoteKernel(RemoteFunction):
    """A kernel of the graded module. Checks pass it to `course.core.stubs.kernel_stub_name`, which
    reads `remote_stub` (read from the graded source); it is launched only through the launchers."""

    def __init__(self, proxy: ProxyModule, name: str, stub: str | None):
        super().__init__(proxy, name)
        self.remote_stub = stub

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.__name__} runs in the grading sandbox: launch it through the module's "
                           "launcher")

    def __getitem__(self, grid):
        return self


class ProxyModule:
    """What a check gets as `module`: the grader's constants and helpers, the child's kernels."""

    def __init__(self, name: str, trusted: types.ModuleType, remote: set[str], kernels: set[str],
                 stubs: dict[str, str], channel: Channel, modules: dict[str, types.ModuleType],
                 dry: types.ModuleType | None = None):
        self.__name__ = f"lessons.{name}"
        object.__setattr__(self, "_state", {"module": name, "trusted": trusted, "channel": channel,
                                            "dry": dry,
                                            "remote": {n: (RemoteKernel(self, n, stubs.get(n)) if n in kernels
                                                           else RemoteFunction(self, n)) for n in remote},
                                            "modules": modules})

    def __getattr__(self, name: str):
        state = object.__getattribute__(self, "_state")
        if name in state["remote"]:
            return state["remote"][name]
        return getattr(state["trusted"], name)

    def __dir__(self):
        return sorted(set(dir(self._state["trusted"])))

    def _call(self, name: str, args: tuple, kwargs: dict):
        state = self._state
        args, blocks = blockread.lift(args, kwargs)  # x watched for block reads: the child watches its copy
        remote = state["remote"]
        callbacks = {n: v for n, v in vars(self).items() if n in remote and v is not remote[n]}
        in_place = name in IN_PLACE.get(state["module"], ())
        outputs = None if in_place or callbacks else shapes.expected(state["dry"], name, args, kwargs)
        return state["channel"].call(state["module"], name, args, kwargs, self._name_of, self._resolve,
                                     callbacks, outputs, blocks=blocks)

    def _name_of(self, obj) -> str | None:
        """A dataclass the child can rebuild: one of a lesson module's own classes or one it imports."""
        cls = type(obj)
        trusted = self._state["trusted"]
        return cls.__name__ if getattr(trusted, cls.__name__, None) is cls else None

    def _resolve(self, name: str) -> type | None:
        cls = getattr(self._state["trusted"], name, None) if name.isidentifier() else None
        return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None


# ------------------------------------------------------------------------------------ what is remote

def remote_names(sources: dict[str, str], holes: dict[str, list[tuple[int, int]]]) -> dict[str, set[str]]:
    """Module -> its top-level names that run in the child: every kernel (`kernel_names`), every
    function whose body holds a hole (1-based line spans of the solution: a hole's first line lies
    in it; its last, an END marker, may lie past the function's last statement), and whatever
    refers to one of those, in its own module or through a relative import of another lesson
    module. So the grader never launches a kernel of a lesson module itself."""
    trees = {m: ast.parse(s) for m, s in sources.items()}
    defined = {m: {n.name: n for n in t.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
               for m, t in trees.items()}
    imported = {m: {alias.asname or alias.name: (node.module, alias.name)
                    for node in t.body if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
                    for alias in node.names} for m, t in trees.items()}
    remote = {m: {name for name, node in defined[m].items()
                  if name in kernel_names(sources[m])
                  or any(node.lineno <= first <= node.end_lineno for first, _ in holes.get(m, []))}
              for m in trees}
    changed = True
    while changed:
        changed = False
        for m in trees:
            tainted = remote[m] | {local for local, (other, name) in imported[m].items()
                                   if name in remote.get(other, set())}
            for name, node in defined[m].items():
                if name in remote[m]:
                    continue
                used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                if used & tainted:
                    remote[m].add(name)
                    changed = True
    return remote


def kernel_names(source: str) -> set[str]:
    """Top-level functions decorated as kernels (@cuda.jit, @triton.jit, ...) or named *_kernel."""
    found = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            decorators = [ast.unparse(d) for d in node.decorator_list]
            if node.name.endswith("_kernel") or any("jit" in d for d in decorators):
                found.add(node.name)
    return found


def solution_sources(solutions: Path) -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(solutions.glob("*.py")) if p.stem != "__init__"}
