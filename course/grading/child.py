"""The grading child: runs one submission's graded lesson modules on the inputs the grader sends.

It starts inside the sandbox (`course.grading.sandbox`) with the harness's launch code on its
path and the submission's graded `lessons/` (`course.grading.splice`), and nothing else of the
grader's: no solutions, no checks, no seed. It reads requests from one pipe and answers on
another (`course.grading.wire`):

- {"op": "call", "module", "name", "args", "kwargs", "callbacks", "blocks"}: call
  `lessons.<module>.<name>` and answer {"result": ..., "after": [every tensor argument after the
  call]} (or "result_is": i when it returned its i-th tensor argument itself) or {"error": ...};
  `callbacks` names module attributes the grader stands in for during the call (a check's
  stand-in for a kernel still left as a stub): calling one asks the grader to run it; `blocks`,
  [position, block] pairs, the arguments to hand the function watched, so that reducing more than
  a block of their columns at once raises (course.core.blockread: the online softmax's check);
- {"op": "time", "hook": [...]}: time the graded kernels with an exercise's bench hook
  (`course.grading.speed`) and answer {"ms": ...} or {"note": ...}.

Its first steps, before any student code can run, drop root (when the sandbox starts it as
root) and set the limits that belong to the process: no core dumps, the output cap per file,
and where no cgroup limits the submission, the process count and (in the simulator) the
address space. What it answers is only ever "here are my outputs": the grader compares them.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import resource
import signal
import sys
import threading


def _drop_privileges(uid: int | None) -> None:
    if uid is None or os.getuid() != 0:
        return
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        os._exit(70)


def _set_limits(config: dict) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    size = config.get("file_bytes")
    if size:
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it: a write over the cap now kills
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    processes = config.get("processes")
    if processes:
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    address_space = config.get("address_space")
    if address_space:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))


def own_copies(value):
    """The tensors of a launcher's result as contiguous tensors of their own (through lists,
    tuples, dicts and dataclasses), as the grader requires of a reply (course.grading.wire)."""
    import copy
    import dataclasses

    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone(memory_format=torch.contiguous_format)
    if isinstance(value, (list, tuple)):
        return type(value)(own_copies(v) for v in value) if type(value) in (list, tuple) else value
    if isinstance(value, dict):
        return {k: own_copies(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = copy.copy(value)
        for f in dataclasses.fields(value):
            object.__setattr__(value, f.name, own_copies(getattr(value, f.name)))
    return value


class Server:
    def __init__(self, requests: int, replies: int):
        from . import wire

        self.wire = wire
        self.requests, self.replies = requests, replies
        self.pid = os.getpid()
        self.busy = False  # a call (or timing) is running: its code may ask the grader (`ask`)
        # A process the code forks is no server: it loses the channel at once, so that nothing it
        # does (an exception climbing back through `call`) can be read as an answer.
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        for fd in (self.requests, self.replies):
            try:
                os.close(fd)
            except OSError:
                pass

    def send(self, message: dict, **values) -> None:
        self.wire.write_all(self.replies, self.wire.frame(message, self._name_of, **values))

    def receive(self, module=None):
        header, blob = self.wire.read_frame(self.requests)
        decoder = self.wire.Decoder(header, blob, lambda name: self._class(module, name),
                                    lambda device: device in ("cpu", "cuda"))
        return header, decoder

    @staticmethod
    def _name_of(obj) -> str:
        return type(obj).__name__

    @staticmethod
    def _class(module, name: str):
        cls = getattr(module, name, None) if module is not None and name.isidentifier() else None
        return cls if isinstance(cls, type) else None

    def serve(self) -> None:
        self.send({"op": "ready"})
        while True:
            header, decoder = self.receive()
            op = header.get("op")
            if op == "call":
                self.call(header, decoder)
            elif op == "time":
                self.time(header)
            else:
                return

    def call(self, header: dict, decoder) -> None:
        from ..core import blockread

        try:
            module = importlib.import_module(f"lessons.{header['module']}")
        except BaseException as error:  # noqa: BLE001  (a broken module is the submission's)
            self.send({"error": describe(error), "import": True})
            return
        decoder.resolve = lambda name: self._class(module, name)
        args = decoder.decode(header.get("args", {"list": []}))
        kwargs = decoder.decode(header.get("kwargs", {"dict": []}))
        saved = {name: getattr(module, name) for name in header.get("callbacks", [])}
        self.busy = True
        try:
            for name in saved:
                setattr(module, name, Callback(self, name))
            # the arguments the grader marked, watched for reads of more than a block at once; the
            # plain ones (`args`) are what goes back after the call
            watched = blockread.watch_marked(args, header.get("blocks", []), header["name"])
            result = blockread.plain(getattr(module, header["name"])(*watched, **kwargs))
        except BaseException as error:  # noqa: BLE001  (whatever the code raised goes back as text)
            self.done()
            self.send({"error": describe(error)})
            return
        finally:
            self.done()
            for name, value in saved.items():
                setattr(module, name, value)
        given = blockread.tensors_in((args, kwargs))
        same = [i for i, tensor in enumerate(given) if result is tensor]  # an in-place launcher returns it
        try:
            if same:
                reply = self.wire.frame({"op": "result", "result_is": same[0]}, after=given)
            else:  # outputs as contiguous tensors of their own: the grader accepts nothing else
                reply = self.wire.frame({"op": "result"}, self._name_of, result=own_copies(result),
                                        after=given)
        except Exception as error:  # noqa: BLE001  (a meta tensor, a closure: whatever cannot be sent)
            why = f"the launcher returned what grading cannot send back: {type(error).__name__}: {error}"
            self.send({"error": {"kind": "TypeError", "message": why[:2000]}})
            return
        self.wire.write_all(self.replies, reply)

    def time(self, header: dict) -> None:
        from .speed import hook_from_spec, time_impl_with

        self.busy = True
        try:
            ms, note = time_impl_with(hook_from_spec(header.get("hook")), "lessons")
        except BaseException as error:  # noqa: BLE001
            ms, note = None, f"timing stopped with {type(error).__name__}"
        self.done()
        self.send({"ms": ms, "note": note})

    def done(self) -> None:
        """The request is answered next: a thread of its code still running (a kernel's, in the
        simulator, after another raised) may no longer ask the grader, whose channel now carries
        the answer and the next request (`ask`)."""
        with EXCHANGE:
            self.busy = False

    def ask(self, message: dict, **values):
        """Send the grader a question during a request, and read its answer: (header, decoder)."""
        with EXCHANGE:  # the simulator runs a kernel's threads at once: one question and answer at a time
            if not self.busy:
                raise RuntimeError("only the code of a call the grader made may ask it anything, and only "
                                   "until that call returns")
            self.send(message, **values)
            return self.receive()


SERVER: Server | None = None  # the running server, for the stand-ins of course.grading.services
EXCHANGE = threading.Lock()  # a request to the grader and its answer, from one thread at a time


def ask_grader(name: str, args: tuple, kwargs: dict):
    """Run service `name` in the grader (course.grading.services) and return its result; its error
    (a ValueError from a validator) is raised here as the same type."""
    server = SERVER
    if server is None:
        raise RuntimeError(f"{name} is run by the grader, and only for a grading child")
    header, decoder = server.ask({"op": "service", "name": name}, args=list(args), kwargs=kwargs)
    if header.get("op") == "service_done":
        return decoder.decode(header.get("result"))
    import builtins

    from .services import ERRORS

    kind = header.get("kind")
    raise (getattr(builtins, kind) if kind in ERRORS else RuntimeError)(str(header.get("message"))[:2000])


class Callback:
    """A module attribute the grader stands in for during one call (a kernel's stand-in): launching
    it, `kernel[grid](*args)`, asks the grader to run the stand-in on these arguments."""

    def __init__(self, server: Server, name: str):
        self.server, self.name = server, name

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kwargs):
        question = {"op": "callback", "name": self.name}
        header, decoder = self.server.ask(question, args=list(args), kwargs=kwargs)
        if header.get("op") != "callback_done":
            why = str(header.get("message"))[:300]
            raise RuntimeError(f"grading's stand-in for {self.name} failed: {why}")
        after = decoder.decode(header.get("after", {"list": []}))
        from ..core.blockread import tensors_in

        for mine, theirs in zip(tensors_in((list(args), kwargs)), after, strict=False):
            mine.copy_(theirs.to(mine.device))
        return None


def describe(error: BaseException) -> dict:
    """An exception as text: its type, message and where in the lessons it was raised."""
    try:
        from course.core.crash import describe as crash

        found = crash(error)
        return {"kind": found.kind, "message": found.message[:2000], "thread": found.thread,
                "place": found.place, "source": found.source[:300], "access": found.access[:500]}
    except Exception:  # noqa: BLE001  (describing must not fail the reply)
        return {"kind": type(error).__name__, "message": str(error)[:2000]}


def main(config: dict) -> None:
    _drop_privileges(config.get("uid"))
    _set_limits(config)
    faulthandler.enable()  # a segfault leaves a traceback on stderr for the feedback
    sys.dont_write_bytecode = True
    import torch  # noqa: F401

    import course  # noqa: F401  (the runtime: simulator or GPU, before numba or triton)

    global SERVER
    server = SERVER = Server(config["requests"], config["replies"])
    try:
        server.serve()
    except EOFError:
        pass
    except OSError:  # a forked copy of the server, without the channel
        if os.getpid() == server.pid:
            raise
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: a submission's atexit hooks or threads must not matter


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
