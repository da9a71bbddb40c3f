"""The grading child: `python -m course.grading.worker`, one per submission (restarted after a crash).

It runs in a temporary copy of the submission (its cwd holds `lessons/`), imports
`course` and `pyspec_ref` from the grader's copy, and reports one JSON line per
exercise through a pipe of its own (`--result-fd`), so whatever the submission
prints cannot be mistaken for a result.

Guards, set up before the submission is imported. They are guards against
accidents and casual tampering, not a security boundary: code running in this
process can undo any of them (run untrusted work in a container or VM):
- memory: RLIMIT_AS (in the simulator only: CUDA reserves far more address space
  than it uses); output: RLIMIT_FSIZE caps every file this process writes;
  no core dumps;
- network: socket connections and name look-ups raise PermissionError;
- files: an audit hook refuses opening for writing, creating, renaming or removing
  anything outside the working copy (and /dev), and records the attempt;
- the harness: every function and class of `course`, `pyspec_ref`, `torch` and
  `builtins` is fingerprinted before the submission is imported; an exercise after
  which any of them changed scores zero, and the child stops (a fresh one goes on).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import resource
import signal
import sys
import time
import traceback

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
PATH_EVENTS = {"os.remove": 0, "os.rmdir": 0, "os.rename": 0, "os.mkdir": 0, "shutil.rmtree": 0,
               "os.symlink": 1, "os.link": 1, "os.truncate": 0, "os.chmod": 0, "shutil.move": 1}


def _set_limits(memory_mb: int, output_mb: int, simulator: bool) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if output_mb:
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it: a print over the cap now kills
        size = output_mb * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    if memory_mb and simulator:
        size = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (size, size))


def _refuse_network() -> None:
    import socket

    def refuse(*args, **kwargs):
        raise PermissionError("the network is off while grading")

    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.socket.sendto = refuse
    socket.create_connection = refuse
    socket.getaddrinfo = refuse
    socket.gethostbyname = refuse


class FileGuard:
    """An audit hook: writes outside `allowed` folders are refused and recorded."""

    def __init__(self, allowed: list[str]):
        self.allowed = [os.path.realpath(a) for a in allowed]
        self.attempts: list[str] = []
        self.active = False

    def _outside(self, path) -> bool:
        if isinstance(path, int):
            return False
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        full = os.path.realpath(os.path.abspath(os.fspath(path)))
        return not any(full == a or full.startswith(a + os.sep) for a in self.allowed)

    def __call__(self, event, args):
        if not self.active:
            return
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & WRITE_FLAGS)
            if not writes or path is None or not self._outside(path):
                return
        elif event in PATH_EVENTS:
            paths = args[: PATH_EVENTS[event] + 1]
            paths = [p for p in paths if isinstance(p, (str, bytes, os.PathLike))]
            if not any(self._outside(p) for p in paths):
                return
            path = paths[0]
        else:
            return
        self.attempts.append(f"{event} {os.fsdecode(path) if not isinstance(path, str) else path}")
        raise PermissionError(f"grading: writing outside the submission's folder is not allowed: {path}")


def _watched_modules():
    import builtins

    import torch

    yield "builtins", builtins
    yield "torch", torch
    for name, module in list(sys.modules.items()):
        if module is not None and (name.split(".")[0] in ("course", "pyspec_ref")):
            yield name, module


def fingerprint() -> dict[str, tuple]:
    """id and code of every public function and class (and class attribute) of the watched modules."""
    import torch

    prints = {}
    for name, module in _watched_modules():
        prints[f"sys.modules[{name!r}]"] = (id(sys.modules.get(name)),)
        for attr, value in list(vars(module).items()):
            if attr.startswith("__"):
                continue
            if callable(value) or isinstance(value, type):
                prints[f"{name}.{attr}"] = (id(value), id(getattr(value, "__code__", None)))
            if isinstance(value, type) and value.__module__.split(".")[0] in ("course", "pyspec_ref"):
                for key, member in list(vars(value).items()):
                    if not key.startswith("__") or key in ("__init__", "__eq__", "__bool__"):
                        prints[f"{name}.{attr}.{key}"] = (id(member), id(getattr(member, "__code__", None)))
    for key, member in list(vars(torch.Tensor).items()):
        if not key.startswith("__") or key in ("__eq__", "__bool__", "__float__", "__int__"):
            prints[f"torch.Tensor.{key}"] = (id(member),)
    return prints


def changed(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    return sorted(k for k in before if after.get(k) != before[k])


def _send(fd: int, message: dict) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _time(exercise) -> tuple[float | None, str]:
    """The student's kernel timed (course.grading.speed); a sys.exit while timing costs the time only."""
    from course.grading.speed import time_impl

    try:
        return time_impl(exercise, "lessons")
    except BaseException as error:  # SystemExit, KeyboardInterrupt: the grade stands, the time does not
        return None, f"timing stopped with {type(error).__name__}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course.grading.worker")
    parser.add_argument("--exercises", required=True, help="comma-separated exercise ids")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--memory-mb", type=int, default=0)
    parser.add_argument("--output-mb", type=int, default=0)
    parser.add_argument("--time", action="store_true", help="on a GPU, time each passed exercise's kernel")
    args = parser.parse_args(argv)
    fd = args.result_fd
    faulthandler.enable()  # a segfault leaves a traceback on stderr for the feedback
    sys.dont_write_bytecode = True
    simulator = os.environ.get("COURSE_SIM") == "1"
    _set_limits(args.memory_mb, args.output_mb, simulator)
    _refuse_network()

    import importlib

    import course
    import pyspec_ref  # noqa: F401
    from course.checks import run_cases
    from course.exercises import EXERCISES

    for module in ("course.checks.diagnose", "course.oracle", "course.core.inputs", "course.core.validate",
                   "course.core.launch", "course.exercise"):
        importlib.import_module(module)
    exercises = [EXERCISES[e] for e in args.exercises.split(",")]
    guard = FileGuard([os.getcwd(), "/dev"])
    sys.addaudithook(guard)
    before = fingerprint()
    _send(fd, {"event": "ready", "mode": course.MODE})
    for exercise in exercises:
        _send(fd, {"event": "start", "exercise": exercise.id})
        started = time.perf_counter()
        message = {"event": "result", "exercise": exercise.id, "results": [], "not_implemented": "",
                   "note": ""}
        guard.active = True
        try:
            module = importlib.import_module(f"lessons.{exercise.module}")
        except SystemExit as error:
            message["note"] = (f"called sys.exit({error.code!r}) while lessons/{exercise.module}.py "
                               "was imported")
            message["violation"] = "exited"
        except BaseException as error:  # SyntaxError, NameError at import, anything
            lines = traceback.format_exception_only(type(error), error)
            message["note"] = f"importing lessons/{exercise.module}.py failed: {''.join(lines).strip()}"
        else:
            try:
                report = run_cases(exercise.id, exercise.cases(module, args.seed))
                message["results"] = [[r.case, bool(r.passed), str(r.detail)] for r in report.results]
                message["not_implemented"] = report.not_implemented
                if args.time and report.passed and exercise.bench is not None:
                    message["student_ms"], message["timing_note"] = _time(exercise)
            except SystemExit as error:
                message["note"] = f"called sys.exit({error.code!r}) while being checked"
                message["violation"] = "exited"
            except BaseException as error:  # a check itself broke (KeyboardInterrupt, MemoryError...)
                message["note"] = f"the check stopped with {type(error).__name__}: {error}"
        guard.active = False
        message["seconds"] = round(time.perf_counter() - started, 3)
        if guard.attempts:
            message["note"] = ("tried to write outside its folder (refused): "
                               + "; ".join(guard.attempts[:5]) + (" ..." if len(guard.attempts) > 5 else "")
                               + (f". {message['note']}" if message["note"] else ""))
            message["violation"] = "writes outside its folder"
            guard.attempts.clear()
        tampered = changed(before, fingerprint())
        if tampered:
            shown = ", ".join(tampered[:5]) + (" ..." if len(tampered) > 5 else "")
            message["note"] = f"changed the grader's code (monkeypatching): {shown}"
            message["violation"] = "monkeypatched the harness"
        _send(fd, message)
        if tampered:
            return 3  # nothing this process computes from now on can be trusted; the parent restarts one
    _send(fd, {"event": "done"})
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: a submission's atexit hooks or threads must not matter


if __name__ == "__main__":
    sys.exit(main())
