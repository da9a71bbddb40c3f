"""The wire between the draft process and the target process (notebook 20): the messages of
`pyspec_ref.parallel_tree` as tensors, the handshake that refuses a mismatched pair, and a
watchdog that stops a process within seconds when its peer dies or hangs.

Messages are fixed-size int64 tensors, so a receiver always posts one receive of a known size
(no pickles, nothing of variable length on the wire):

    [MAGIC, kind, round, count, next_token, payload of 2 * tree_size ints]

SUBTREE: count nodes, payload parents then tokens (each padded to tree_size); in sampling mode a
second tensor follows, the draft distribution q of each node, float32 (tree_size, V).
ACCEPTED and STOP: count = path length, payload the path (indices into the last SUBTREE).
`decode` checks everything a receiver relies on (the magic number, the kind, the counts, that the
parents form a tree rooted at 0 and the path a root path of it) and names what is wrong.

Three transports carry them (TRANSPORTS): "shm", a file both processes map (`Mailbox`: two
processes of one host, whatever their devices); "nccl", device tensors between two GPUs; "gloo",
CPU tensors through a socket (`Link`, over torch.distributed, for both).

The handshake (`hello`, `check_hello`) runs on the CPU before either side loads its model onto a
GPU: each side sends its role, its model's vocabulary and dtype, and the settings of the run; a
difference stops both sides with one message naming every field that differs.

Faults (`Watchdog`): each process bumps a heartbeat counter in the rendezvous store every
`BEAT_S` seconds from a thread of its own, and checks its peer's. A peer whose counter stops for
`peer_timeout` seconds (dead, or frozen), a store that cannot be reached or does not answer within
`peer_timeout` (the process that hosts it, the target, is gone or frozen), a peer that reported a
failure, or a message awaited for longer than `message_timeout` seconds: the watchdog prints one
line saying which and exits the process (status EXIT_PEER), so neither side ever waits forever,
whatever call its main thread is blocked in. Gloo itself also fails a receive at once when the
peer's connection closes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import sys
import threading
import time
import zlib
from dataclasses import dataclass

import torch

MAGIC = 0x5357_5350  # "SWSP"
VERSION = 1
HEADER = 5  # magic, kind, round, count, next_token
SUBTREE, ACCEPTED, STOP = "subtree", "accepted", "stop"
TRANSPORTS = ("shm", "nccl", "gloo")
KIND_CODES = {SUBTREE: 1, ACCEPTED: 2, STOP: 3}
KIND_NAMES = {code: name for name, code in KIND_CODES.items()}
ROLES = ("target", "draft")  # rank 0 hosts the store and verifies; rank 1 drafts
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
EXIT_ERROR, EXIT_PEER, EXIT_MISMATCH = 1, 3, 4
BEAT_S = 0.1


class WireError(ValueError):
    """A message that breaks the protocol (a bug on the sending side, or a stale peer)."""


class PeerLost(RuntimeError):
    """The other process closed its connection, or sent nothing for too long."""


class PairMismatch(ValueError):
    """The two sides cannot work together (vocabularies, dtypes, settings)."""


@dataclass(frozen=True)
class Subtree:
    """SUBTREE(round): the nodes the draft sends for verification; q in sampling mode."""

    round: int
    parents: list[int]
    tokens: list[int]
    q: torch.Tensor | None = None
    kind: str = SUBTREE


@dataclass(frozen=True)
class Reply:
    """ACCEPTED(round) or STOP(round): the accepted path (indices into that round's SUBTREE) and
    the next token."""

    kind: str
    round: int
    path: list[int]
    next_token: int


def message_length(tree_size: int) -> int:
    return HEADER + 2 * tree_size


def encode_values(message: Subtree | Reply, tree_size: int) -> list[int]:
    """The message's ints, `message_length(tree_size)` of them (plain Python: a few microseconds,
    where building it out of tensor slices costs tens)."""
    if isinstance(message, Subtree):
        n = len(message.parents)
        if not 1 <= n <= tree_size or len(message.tokens) != n:
            raise WireError(f"a SUBTREE of {n} nodes and {len(message.tokens)} tokens does not fit "
                            f"tree_size = {tree_size}")
        pad = [0] * (tree_size - n)
        header = [MAGIC, KIND_CODES[SUBTREE], message.round, n, -1]
        return [*header, *message.parents, *pad, *message.tokens, *pad]
    n = len(message.path)
    if not 1 <= n <= tree_size or message.kind not in (ACCEPTED, STOP):
        raise WireError(f"a {message.kind} reply with a path of {n} nodes (tree_size = {tree_size})")
    return [MAGIC, KIND_CODES[message.kind], message.round, n, message.next_token, *message.path,
            *[0] * (2 * tree_size - n)]


def encode(message: Subtree | Reply, tree_size: int, device=None) -> torch.Tensor:
    """The message's int64 tensor (on `device`, the CPU by default)."""
    return torch.tensor(encode_values(message, tree_size), dtype=torch.int64, device=device)


def decode(values: list[int], tree_size: int, vocab_size: int, sender: str,
           last_subtree: Subtree | None = None) -> Subtree | Reply:
    """The message in `values` (a received tensor's list), checked; WireError naming the sender and
    what is wrong. A reply's path is checked against `last_subtree`, the SUBTREE it answers."""
    if len(values) != message_length(tree_size):
        raise WireError(f"a message of {len(values)} ints from the {sender}, expected "
                        f"{message_length(tree_size)}")
    magic, code, rnd, count, nxt = values[:HEADER]
    if magic != MAGIC:
        raise WireError(f"the {sender} sent a message without the protocol's magic number ({magic:#x}): "
                        "is the other process running this course's parallel worker?")
    kind = KIND_NAMES.get(code)
    if kind is None:
        raise WireError(f"the {sender} sent a message of unknown kind {code}")
    if not 1 <= count <= tree_size:
        raise WireError(f"the {sender}'s {kind} message counts {count} nodes; 1 to {tree_size} expected")
    payload = values[HEADER:]
    if kind == SUBTREE:
        parents = payload[:count]
        tokens = payload[tree_size:tree_size + count]
        if parents[0] != -1 or any(not 0 <= p < j for j, p in enumerate(parents) if j):
            raise WireError(f"the draft's SUBTREE({rnd}) parents {parents} are not a tree rooted at 0 "
                            "with parents before children")
        if any(not 0 <= t < vocab_size for t in tokens):
            raise WireError(f"the draft's SUBTREE({rnd}) tokens {tokens} are not all in [0, {vocab_size})")
        return Subtree(rnd, parents, tokens)
    path = payload[:count]
    if not 0 <= nxt < vocab_size:
        raise WireError(f"the target's {kind}({rnd}) next token {nxt} is not in [0, {vocab_size})")
    if last_subtree is not None:
        if rnd != last_subtree.round:
            raise WireError(f"the target answered round {rnd}, the draft sent round {last_subtree.round}")
        n = len(last_subtree.parents)
        if path[0] != 0 or any(not 0 <= b < n or last_subtree.parents[b] != a
                               for a, b in zip(path, path[1:], strict=False)):
            raise WireError(f"the target's {kind}({rnd}) path {path} is not a root path of the "
                            f"{n}-node SUBTREE({rnd})")
    return Reply(kind, rnd, path, nxt)


# --------------------------------------------------------------------------- the handshake

HELLO_FIELDS = ("magic", "version", "role", "vocab_size", "dtype", "tree_size", "width", "branch",
                "max_new_tokens", "eos", "runs_crc")


def hello(role: str, vocab_size: int, dtype: torch.dtype, *, tree_size: int, width: int, branch: int,
          max_new_tokens: int, eos: int | None, runs_crc: int) -> torch.Tensor:
    """This side's description, as an int64 tensor of len(HELLO_FIELDS); runs_crc stands for the
    rest of the job (each run's prompt, mode, steps, seed)."""
    if dtype not in DTYPES:
        raise PairMismatch(f"the {role}'s dtype {dtype} is none of {DTYPES}")
    values = (MAGIC, VERSION, ROLES.index(role), vocab_size, DTYPES.index(dtype), tree_size, width, branch,
              max_new_tokens, -1 if eos is None else eos, runs_crc)
    return torch.tensor(values, dtype=torch.int64)


def check_hello(mine: list[int], theirs: list[int]) -> None:
    """PairMismatch naming every field in which the two sides differ (or a peer that is no worker)."""
    me, peer = dict(zip(HELLO_FIELDS, mine, strict=True)), dict(zip(HELLO_FIELDS, theirs, strict=True))
    if peer["magic"] != MAGIC or peer["version"] != VERSION:
        raise PairMismatch(f"the peer speaks another protocol (magic {peer['magic']:#x}, version "
                           f"{peer['version']}; this side {MAGIC:#x}, version {VERSION})")
    if peer["role"] == me["role"] or peer["role"] not in (0, 1):
        raise PairMismatch(f"both processes claim the role {ROLES[me['role']]!r}: one target and one "
                           "draft are needed")
    shown = {"dtype": lambda i: str(DTYPES[i]).replace("torch.", ""),
             "eos": lambda i: "none" if i < 0 else str(i),
             "runs_crc": lambda i: f"{i:#010x} (the runs: prompts, modes, steps, seeds)"}
    diffs = []
    for field in HELLO_FIELDS[3:]:
        if me[field] != peer[field]:
            by_role = {me["role"]: me[field], peer["role"]: peer[field]}
            show = shown.get(field, str)
            diffs.append(f"{field}: target {show(by_role[0])}, draft {show(by_role[1])}")
    if diffs:
        raise PairMismatch("the target and the draft do not match, so neither was loaded onto a GPU: "
                           + "; ".join(diffs))


# --------------------------------------------------------------------------- the link


class Link:
    """One side's end of the wire, over torch.distributed: `group` is the data group (NCCL between
    two GPUs, with the tensors on `device`; None: the default gloo group, CPU tensors). Replies are
    checked against the last SUBTREE this side sent."""

    def __init__(self, rank: int, tree_size: int, vocab_size: int, device, *, group=None, nccl: bool = False,
                 watchdog: Watchdog | None = None):
        self.rank, self.peer = rank, 1 - rank
        self.tree_size, self.vocab_size = tree_size, vocab_size
        self.device, self.group, self.nccl, self.watchdog = torch.device(device), group, nccl, watchdog
        self.ints = torch.zeros(message_length(tree_size), dtype=torch.int64, device=self.device)
        self.floats = torch.zeros((tree_size, vocab_size), dtype=torch.float32, device=self.device)
        self.last_subtree: Subtree | None = None
        self._sending: list = []  # (work, tensor): a tensor stays alive until its send completes

    def send(self, message: Subtree | Reply) -> None:
        import torch.distributed as dist

        self._finish_sends()
        tensors = [encode(message, self.tree_size, self.device)]
        if isinstance(message, Subtree):
            self.last_subtree = message
            if message.q is not None:
                q = torch.zeros((self.tree_size, self.vocab_size), dtype=torch.float32)
                q[:len(message.parents)] = message.q.float().cpu()
                tensors.append(q.to(self.device))
        try:
            self._sending = [(dist.isend(t, self.peer, group=self.group), t) for t in tensors]
        except RuntimeError as error:  # gloo writes at once: a peer gone shows here
            raise _peer_lost(error, ROLES[self.peer], None) from None

    def recv(self, what: str, with_q: bool = False) -> Subtree | Reply:
        """The next message (`what` names it for the watchdog's message timeout); with_q: a SUBTREE's
        q follows it (sampling mode)."""
        import torch.distributed as dist

        self._wait(dist.irecv(self.ints, self.peer, group=self.group), what)
        message = decode(self.ints.tolist(), self.tree_size, self.vocab_size, ROLES[self.peer],
                         self.last_subtree)
        if isinstance(message, Subtree) and with_q:
            self._wait(dist.irecv(self.floats, self.peer, group=self.group), what)
            message = Subtree(message.round, message.parents, message.tokens,
                              self.floats[:len(message.parents)].clone())
        return message

    def close(self) -> None:
        self._finish_sends()

    def _finish_sends(self) -> None:
        for work, _ in self._sending:
            self._wait(work)
        self._sending = []

    def _wait(self, work, what: str | None = None) -> None:
        """Wait for a send or a receive (`what`: the message awaited, for the watchdog's timeout).
        NCCL: poll, so that the host never blocks inside the driver and the watchdog can always
        act; gloo: block (gloo releases the GIL, fails when the peer's connection closes, and times
        out after the process group's timeout)."""
        waiting = self.watchdog.waiting(what) if self.watchdog and what else contextlib.nullcontext()
        peer = ROLES[self.peer]
        try:
            with waiting:
                if self.nccl:
                    while not work.is_completed():
                        time.sleep(0)  # yields the GIL to the watchdog; a real sleep adds ~60 us a message
                work.wait()
        except RuntimeError as error:  # gloo: the peer's socket closed, or the group's timeout passed
            raise _peer_lost(error, peer, what) from None


class Mailbox:
    """One side's end of the wire through shared memory, for two processes of one host (transport
    "shm"): a file that both map, one slot per sender. Neither GPU nor network stack is between
    them, so a message costs what it takes to write a few hundred bytes and to see them change,
    with Python's encoding around it: tens of microseconds, where a torch.distributed send and
    receive of the same bytes took several times as long (notebook 20 measures all three).

    A slot is [sequence number, checksum, rows of q], the message's ints, then room for q
    (tree_size, V) float32. The sender writes the message and its checksum, then the sequence
    number; the receiver spins on the sequence number, then checks the checksum. It is SwiftSpec's
    NCCL LL protocol (§3.3, Algorithm 2) on the host: a flag stored after the data says the data is
    there. LL stores data and flag in one 8-byte atomic store; here a processor may make the writes
    visible in another order (ARM does), so the checksum covers the number and the message, and a
    message whose checksum does not match yet is read again. One slot per direction is enough
    because the protocol alternates: a side never sends again before the peer has answered, and the
    peer has copied the message out before it answers. The receiver spins for SPIN_S, then sleeps
    between looks, so that a long wait (a slow simulated pass) leaves the processor to others; the
    watchdog thread watches it as it watches a torch.distributed receive."""

    SPIN_S = 0.002  # about three verifications of the medium pair on an H200: spin, then sleep
    NAP_S = 1e-4

    def __init__(self, path, rank: int, tree_size: int, vocab_size: int, *, watchdog: Watchdog | None = None):
        import mmap

        import numpy as np

        self.rank, self.peer = rank, 1 - rank
        self.tree_size, self.vocab_size, self.watchdog = tree_size, vocab_size, watchdog
        ints = 3 + message_length(tree_size)
        slot = 8 * ints + 4 * tree_size * vocab_size
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, 2 * slot)  # both sides: the same size, so the second call changes nothing
            self._map = mmap.mmap(fd, 2 * slot)
        finally:
            os.close(fd)
        self._ints = [np.frombuffer(self._map, np.int64, ints, k * slot) for k in (0, 1)]
        self._floats = [np.frombuffer(self._map, np.float32, tree_size * vocab_size, k * slot + 8 * ints)
                        .reshape(tree_size, vocab_size) for k in (0, 1)]
        self.sent = self.received = 0
        self.last_subtree: Subtree | None = None

    def send(self, message: Subtree | Reply) -> None:
        ints, floats = self._ints[self.rank], self._floats[self.rank]
        ints[3:] = encode_values(message, self.tree_size)
        rows = 0
        if isinstance(message, Subtree):
            self.last_subtree = message
            if message.q is not None:
                rows = len(message.parents)
                floats[:rows] = message.q.detach().float().cpu().numpy()
        ints[2] = rows
        self.sent += 1
        ints[1] = self._checksum(self.sent, ints[2:], floats[:rows])
        ints[0] = self.sent  # last: the receiver reads nothing before it sees this change

    def recv(self, what: str, with_q: bool = False) -> Subtree | Reply:
        """The next message, as `Link.recv`."""
        waiting = self.watchdog.waiting(what) if self.watchdog else contextlib.nullcontext()
        with waiting:
            values, q = self._await(self.received + 1)
        self.received += 1
        message = decode(values, self.tree_size, self.vocab_size, ROLES[self.peer], self.last_subtree)
        if isinstance(message, Subtree) and with_q:
            if q is None or len(q) != len(message.parents):
                raise WireError(f"the draft's SUBTREE({message.round}) came without q, the draft's "
                                "distributions, which sampling needs")
            message = Subtree(message.round, message.parents, message.tokens, torch.from_numpy(q))
        return message

    def _await(self, number: int) -> tuple[list[int], object]:
        """Spin (then nap) until message `number` can be read (`_read`)."""
        start = time.perf_counter()
        while (message := self._read(number)) is None:
            if time.perf_counter() - start > self.SPIN_S:
                time.sleep(self.NAP_S)
        return message

    def _read(self, number: int) -> tuple[list[int], object] | None:
        """Message `number` from the peer's slot (its ints, and q's rows or None), or None while the
        slot shows an older one or its checksum does not match yet."""
        ints, floats = self._ints[self.peer], self._floats[self.peer]
        seen = int(ints[0])
        if seen > number:
            raise WireError(f"the {ROLES[self.peer]} sent message {seen} before this side read message "
                            f"{number}: it does not wait for replies")
        if seen < number:
            return None
        checksum, body = int(ints[1]), ints[2:].copy()
        q = floats[:int(body[0])].copy()
        if checksum != self._checksum(number, body, q):
            return None
        return body[1:].tolist(), q if len(q) else None

    @staticmethod
    def _checksum(number: int, body, q) -> int:
        """CRC-32 of the message's number, its ints (from the rows of q on) and q's rows: a slot
        that still shows an older message, or part of one, does not match."""
        return zlib.crc32(q.tobytes(), zlib.crc32(body.tobytes(), zlib.crc32(number.to_bytes(8, "little"))))

    def close(self) -> None:
        """Nothing is in flight: a sent message is in the peer's memory already."""


def _peer_lost(error: RuntimeError, peer: str, what: str | None) -> Exception:
    """PeerLost for gloo's errors that mean the peer is gone or silent; else the error itself."""
    text = str(error)
    gone = ("Connection closed", "Connection reset", "Broken pipe", "Socket closed")
    if any(sign in text for sign in gone):
        return PeerLost(f"the {peer} closed its connection (its process ended)")
    if "Timed out" in text:
        return PeerLost(f"no {what or 'message'} from the {peer} within the process group's timeout")
    return error


# --------------------------------------------------------------------------- faults


class Watchdog:
    """See the module docstring. `waiting(what)` marks the main thread as waiting for a message."""

    def __init__(self, store, rank: int, *, peer_timeout: float, message_timeout: float,
                 error_file: str | None = None):
        self.store, self.rank, self.peer = store, rank, 1 - rank
        self.peer_timeout, self.message_timeout = peer_timeout, message_timeout
        self.error_file = error_file
        self.awaiting: tuple[str, float] | None = None
        self._stop = threading.Event()
        self._failing = threading.Lock()  # one failure is reported, by whichever thread sees it first
        self._thread = threading.Thread(target=self._watch, name="parallel-watchdog", daemon=True)

    @property
    def me(self) -> str:
        return ROLES[self.rank]

    @property
    def other(self) -> str:
        return ROLES[self.peer]

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (before an orderly shutdown, when the peer may leave first)."""
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def waiting(self, what: str):
        self.awaiting = (what, time.monotonic())
        try:
            yield
        finally:
            self.awaiting = None

    def _beat(self) -> tuple[int, str]:
        """Bump this side's counter; the peer's counter and the failure it reported ("" if none)."""
        self.store.add(f"beat/{self.rank}", 1)
        beats = self.store.add(f"beat/{self.peer}", 0)
        failed = self.store.check([f"failed/{self.peer}"])
        return beats, self.store.get(f"failed/{self.peer}").decode() if failed else ""

    def _watch(self) -> None:
        seen, last_change = -1, time.monotonic()
        # The store's calls run on a thread of their own: a frozen store host (the target) never
        # answers them, and torch's store timeout does not cover a server that stopped mid-call.
        asker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="parallel-watchdog-store")
        while not self._stop.wait(BEAT_S):
            now = time.monotonic()
            try:
                beats, reason = asker.submit(self._beat).result(timeout=self.peer_timeout)
            except concurrent.futures.TimeoutError:
                self.fail(f"lost contact with the {self.other}: the store it hosts has not answered for "
                          f"{self.peer_timeout:.1f} s (its process is frozen)", tell_peer=False)
                return
            except Exception as error:  # the store's host (the target) is gone
                self.fail(f"lost contact with the {self.other} (its process ended or its connection "
                          f"broke: {str(error).splitlines()[0]})", tell_peer=False)
                return
            if reason:
                self.fail(f"the {self.other} stopped: {reason}", tell_peer=False)
                return
            if beats != seen:
                seen, last_change = beats, now
            elif now - last_change > self.peer_timeout:
                self.fail(f"the {self.other} has given no sign of life for {now - last_change:.1f} s "
                          "(its process died or is frozen)")
                return
            awaiting = self.awaiting
            if awaiting is not None and now - awaiting[1] > self.message_timeout:
                self.fail(f"no {awaiting[0]} from the {self.other} for {now - awaiting[1]:.1f} s "
                          f"(message_timeout = {self.message_timeout} s)")
                return

    def fail(self, message: str, tell_peer: bool = True, status: int = EXIT_PEER) -> None:
        """Say why, tell the peer (if it can still hear), and leave the process at once: the main
        thread may be blocked inside a receive that would never return."""
        if not self._failing.acquire(blocking=False):
            time.sleep(60)  # the other thread is already reporting and will end the process
        report(self.me, message, self.error_file)
        if tell_peer:
            with contextlib.suppress(Exception):
                self.store.set(f"failed/{self.rank}", message)
                time.sleep(10 * BEAT_S)  # the target hosts the store: let the peer's watchdog read it
        os._exit(status)


def report(role: str, message: str, error_file: str | None) -> None:
    """One line on stderr, and the same line in error_file for the launcher."""
    line = f"parallel generation, {role} process: {message}; stopping"
    print(line, file=sys.stderr, flush=True)
    if error_file:
        with contextlib.suppress(OSError), open(error_file, "x") as f:  # the first word stands
            f.write(line + "\n")
