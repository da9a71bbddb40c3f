"""The sandbox a grading child runs in: bubblewrap, a cgroup, and limits for the whole submission.

Each child (`course.grading.child`) runs under bubblewrap (`bwrap`) with
- the system (/usr and its links, the dynamic loader's cache) and the Python it needs (its prefix
  and every folder on the grader's own sys.path, found at run time, not written here) read-only,
  and, on a GPU, the /dev/nvidia* device nodes and /sys;
- the harness copy (`harness`: the parts of course/ that launch kernels; never solutions/, tests/,
  the checks, the exercise table, the oracle or pyspec_ref, whose few functions launch code needs
  the grader runs for it: `course.grading.services`) and the submission's graded lessons/
  read-only, under /grading;
- writable only a private /tmp and /grading/work (its home and working folder), each a tmpfs of
  the output limit's size, and /grading/cache for Triton's and Numba's caches, a tmpfs of the
  cache limit's size;
- no network, its own PID, IPC and UTS namespaces, a new session, a fresh environment, no
  capabilities; when the grader runs as root, the child drops to an unprivileged uid of its own
  before any student code runs (with every capability gone, the kernel keeps it there);
- no path to the grader's repository, the output folder, the submissions or other students:
  none is bound, and any that lies inside a bound folder is hidden under an empty tmpfs.

Limits hold for the whole submission, all its processes together: memory and process count
through a cgroup of its own (cgroup v2, else v1's memory and pids controllers) when the grader
can create one; otherwise each process gets RLIMIT_NPROC (per sandbox: its own uid or user
namespace) and, in the simulator, RLIMIT_AS, while the grader adds up the sandbox's memory
(proportional set size) four times a second and stops it past the limit. Output: the two
tmpfs are no larger than the output limit and each file the child writes (stdout and stderr
included) is capped by RLIMIT_FSIZE; the grader adds the four up at the same rate and stops the
submission when the sum passes the limit. CPU time: the cgroup's accounting where it has one, else
the sandbox's process tree from /proc (`Child.cpu_seconds`), checked at the same rate against the
limit the grader sets (`Child.cpu_limit`). Killing bubblewrap kills everything inside
(`--die-with-parent` on a PID namespace), detached (setsid) helpers included.
"""

from __future__ import annotations

import functools
import glob
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

INSIDE = Path("/grading")
CPU_PERIOD_US = 100_000
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
                "/etc/localtime")
# What the child's environment keeps of the grader's: where CUDA lives and which GPU it uses.
PASSED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "NUMBA_CUDA_DRIVER",
              "NVIDIA_VISIBLE_DEVICES", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "OMP_NUM_THREADS")
FIRST_UID = 60000
_uids = itertools.count()
BOOT = ("import json, sys; config = json.loads(sys.argv[1]); sys.path[:0] = config['path']; "
        "from course.grading.child import main; main(config)")
JOIN_CGROUP = ('n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 97; shift; n=$((n - 1)); done; '
               'exec "$@"')


class SandboxMissing(RuntimeError):
    """bubblewrap is not installed or cannot run here."""


@functools.cache
def bwrap() -> str | None:
    """The bwrap executable when it runs here (it needs user namespaces or root), else None."""
    found = shutil.which("bwrap")
    if found is None:
        return None
    trial = [found, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--dev", "/dev", "--proc",
             "/proc", "--tmpfs", "/tmp", "true"]
    try:
        ok = subprocess.run(trial, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return found if ok else None


@dataclass(frozen=True)
class Plan:
    """What every child of one grading run sees: the same harness, Python and binds."""

    harness: Path
    python: str
    path: tuple[str, ...]  # the child's sys.path after the harness and its lessons
    binds: tuple[str, ...]  # read-only, at the same path inside
    hidden: tuple[str, ...]  # inside a bound folder, hidden under an empty tmpfs
    gpu: bool
    env: tuple[tuple[str, str], ...]


def make_plan(harness: Path, hidden: list[Path], gpu: bool, simulator: bool, small_sizes: bool) -> Plan:
    """The plan for this grader's Python: sys.path and prefixes read from the running interpreter."""
    if gpu:  # the driver makes some /dev/nvidia* nodes (nvidia-uvm) when a context first needs them
        import torch

        torch.cuda.init()
    secret = [Path(p).resolve() for p in hidden]
    prefixes = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    # The child's path: the grader's sys.path entries that belong to the interpreter (its prefixes,
    # site-packages) or that PYTHONPATH names, never the grader's working folder or a secret (an
    # editable install puts the repository on the path). A folder that holds a secret is bound
    # with the secret hidden (below).
    roots = [*prefixes, *_site_folders(), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    roots = [str(Path(r).resolve()) for r in roots if r and os.path.isdir(r)]
    path = [str(Path(entry).resolve()) for entry in sys.path
            if entry and os.path.exists(entry) and Path(entry).resolve() not in secret
            and _inside_any(str(Path(entry).resolve()), roots)]
    executable = os.path.abspath(sys.executable)
    chain = [executable]
    while os.path.islink(chain[-1]) and len(chain) < 16:
        chain.append(os.path.join(os.path.dirname(chain[-1]), os.readlink(chain[-1])))
    extra = {os.path.dirname(os.path.abspath(p)) for p in chain}
    env_dirs = [d for name in ("CUDA_HOME", "CUDA_PATH") for d in [os.environ.get(name, "")] if d]
    env_dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    binds = []
    for candidate in [*SYSTEM, *SYSTEM_FILES, *sorted(prefixes), *sorted(extra), *path, *env_dirs]:
        if os.path.lexists(candidate) and candidate not in binds and not _inside_any(candidate, binds):
            binds.append(candidate)
    binds = [b for b in binds if not any(Path(b).resolve() == s for s in secret)]
    hidden_inside = [str(s) for s in secret if s.is_dir() and any(Path(b) in s.parents for b in binds)]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(INSIDE / "work"), "TMPDIR": "/tmp",
           "USER": "student", "LOGNAME": "student", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONNOUSERSITE": "1", "COURSE_SIM": "1" if simulator else "0",
           "COURSE_SIZES": "small" if small_sizes else "full",
           "TRITON_CACHE_DIR": str(INSIDE / "cache" / "triton"),
           "NUMBA_CACHE_DIR": str(INSIDE / "cache" / "numba"), "MPLCONFIGDIR": str(INSIDE / "cache" / "mpl")}
    env.update({name: os.environ[name] for name in PASSED_ENV if name in os.environ})
    return Plan(harness, executable, tuple(path), tuple(binds), tuple(hidden_inside), gpu,
                tuple(sorted(env.items())))


def _site_folders() -> list[str]:
    import site

    folders = list(getattr(site, "getsitepackages", lambda: [])())
    user = getattr(site, "getusersitepackages", lambda: "")()
    return folders + ([user] if isinstance(user, str) and user else [])


def _inside_any(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


# ------------------------------------------------------------------------------------ the harness

# What the child's harness leaves out of course/: the exercise table and every check (their cases,
# tolerances and diagnostics), the capstone. Its course/__init__.py imports the runtime alone.
LEFT_OUT = ("registry.py", "topics/*/exercises.py", "checks/diagnose.py", "checks/diagnose_attention.py",
            "topics/*/check.py", "capstone", "__main__.py", "oracle")
HARNESS_INIT = '''"""The grading child's copy of the harness: what launching kernels needs
(course.grading.sandbox)."""

from .core import runtime  # noqa: F401  (decides between GPU and simulator before numba or triton)
'''


def copy_harness(target: Path) -> None:
    """Write the child's harness into target: course/ less LEFT_OUT (the oracle, the checks, the
    exercise table), and for pyspec_ref and course.oracle only the stand-ins of what launch code
    asks the grader to run (course.grading.services): no answer is in the sandbox."""
    from ..core.regions import ROOT
    from .services import stand_in_sources

    course = ROOT / "course"
    skip = {p for pattern in LEFT_OUT for p in course.glob(pattern)}

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__" or Path(folder, n) in skip]

    shutil.copytree(course, target / "course", ignore=ignore)
    (target / "course" / "__init__.py").write_text(HARNESS_INIT)
    for relative, source in stand_in_sources().items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    readable(target)


def readable(folder: Path) -> None:
    """Let the child's own uid read a folder the grader wrote (its temporary folders are private)."""
    folder.chmod(0o755)
    for root, folders, files in os.walk(folder):
        for name in folders:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


# ------------------------------------------------------------------------------------ cgroups

@dataclass
class Cgroup:
    """A cgroup of the submission's own: memory and process limits for everything inside."""

    folders: list[Path]
    version: int
    cpu_capped: bool = False  # cpu.max holds it to one CPU
    cpu_usage: Path | None = None  # v2's cpu.stat or v1's cpuacct.usage: its processes' CPU time together

    @classmethod
    def create(cls, name: str, memory_bytes: int, processes: int) -> Cgroup | None:
        """None where this grader cannot make one (no write access, no controllers, or a process
        cannot join it: cgroup v2 keeps processes out of a cgroup whose children hold controllers)."""
        for attempt in (cls._v2, cls._v1):
            try:
                made = attempt(name, memory_bytes, processes)
            except OSError:
                made = None
            if made is not None and made._joinable():
                return made
            if made is not None:
                made.remove()
        return None

    def _joinable(self) -> bool:
        command = ["/bin/sh", "-c", JOIN_CGROUP, "sh", str(len(self.procs)), *self.procs, "true"]
        trial = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        return trial.returncode == 0

    @staticmethod
    def _own(controller: str) -> tuple[Path, str] | None:
        """(mount point, our path in it) for a v1 controller ('' for the v2 hierarchy)."""
        mounts = {}
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fstype, _, options = (right.split() + ["", "", ""])[:3]
            point = left.split()[4]
            if fstype == "cgroup2" and controller == "":
                mounts.setdefault("", Path(point))
            elif fstype == "cgroup" and controller in options.split(","):
                mounts[controller] = Path(point)
        if controller not in mounts:
            return None
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            number, controllers, path = line.split(":", 2)
            if (controller == "" and number == "0") or controller in controllers.split(","):
                return mounts[controller], path.lstrip("/")
        return None

    @classmethod
    def _v2(cls, name, memory_bytes, processes) -> Cgroup | None:
        own = cls._own("")
        if own is None:
            return None
        folder = own[0] / own[1] / name
        folder.mkdir()
        if not (folder / "memory.max").exists() or not (folder / "pids.max").exists():
            folder.rmdir()
            return None
        (folder / "memory.max").write_text(str(memory_bytes))
        if (folder / "memory.swap.max").exists():
            (folder / "memory.swap.max").write_text("0")
        (folder / "pids.max").write_text(str(processes))
        made = cls([folder], 2, cpu_usage=folder / "cpu.stat" if (folder / "cpu.stat").exists() else None)
        if (folder / "cpu.max").exists():  # one CPU at most, however many helpers it starts
            try:
                (folder / "cpu.max").write_text(f"{CPU_PERIOD_US} {CPU_PERIOD_US}")
                made.cpu_capped = True
            except OSError:
                pass
        return made

    @classmethod
    def _v1(cls, name, memory_bytes, processes) -> Cgroup | None:
        memory, pids = cls._own("memory"), cls._own("pids")
        if memory is None or pids is None:
            return None
        folders = [memory[0] / memory[1] / name, pids[0] / pids[1] / name]
        made = []
        try:
            for folder in folders:
                folder.mkdir()
                made.append(folder)
            (folders[0] / "memory.limit_in_bytes").write_text(str(memory_bytes))
            if (folders[0] / "memory.memsw.limit_in_bytes").exists():
                try:
                    (folders[0] / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                except OSError:
                    pass
            (folders[1] / "pids.max").write_text(str(processes))
        except OSError:
            for folder in made:
                folder.rmdir()
            raise
        group = cls(folders, 1)
        cpu = cls._own("cpu")
        if cpu is not None:  # one CPU at most (the cfs quota), where the cpu controller is mounted
            folder = cpu[0] / cpu[1] / name
            try:
                folder.mkdir()
                (folder / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                (folder / "cpu.cfs_quota_us").write_text(str(CPU_PERIOD_US))
                group.folders.append(folder)
                group.cpu_capped = True
            except OSError:
                if folder.is_dir():
                    folder.rmdir()
        group._account_v1(name)
        return group

    def _account_v1(self, name: str) -> None:
        """v1's cpuacct controller, where mounted: the CPU time of everything inside, together."""
        cpuacct = self._own("cpuacct")
        if cpuacct is None:
            return
        folder = cpuacct[0] / cpuacct[1] / name
        try:
            if not folder.is_dir():  # cpu and cpuacct mounted apart: a folder of its own
                folder.mkdir()
                self.folders.append(folder)
            if (folder / "cpuacct.usage").exists():
                self.cpu_usage = folder / "cpuacct.usage"
        except OSError:
            pass

    def cpu_seconds(self) -> float | None:
        """The CPU time its processes used, all of them together (exited ones included), or None
        where this cgroup has no CPU accounting."""
        if self.cpu_usage is None:
            return None
        try:
            text = self.cpu_usage.read_text()
            if self.cpu_usage.name == "cpu.stat":
                usage = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
                return int(usage["usage_usec"]) / 1e6
            return int(text.split()[0]) / 1e9
        except (OSError, ValueError, KeyError, IndexError):
            return None

    @classmethod
    def probe(cls) -> str:
        """Which whole-submission limits this grader can set: 'cgroup v2', 'cgroup v1', or the fallback."""
        made = cls.create(f"course-grade-probe-{os.getpid()}", 1 << 30, 64)
        if made is None:
            return "per process (RLIMIT_NPROC, RLIMIT_AS in the simulator) and the grader's polling"
        made.remove()
        return (f"cgroup v{made.version}" + (", cpu capped: one CPU each" if made.cpu_capped else "")
                + (", cpu time from the cgroup" if made.cpu_usage is not None else ""))

    @property
    def procs(self) -> list[str]:
        return [str(f / "cgroup.procs") for f in self.folders]

    def out_of_memory(self) -> bool:
        try:
            if self.version == 2:
                events = (self.folders[0] / "memory.events").read_text()
                return any(line.split()[0] in ("oom_kill", "oom") and int(line.split()[1]) > 0
                           for line in events.splitlines())
            return _oom_killed_v1(self.folders[0])
        except (OSError, ValueError, IndexError):
            return False

    def pids(self) -> list[int]:
        found = set()
        for procs in self.procs:
            try:
                found |= {int(p) for p in Path(procs).read_text().split()}
            except (OSError, ValueError):
                pass
        return sorted(found)

    def remove(self) -> None:
        """Kill whatever is left inside, then remove the cgroup."""
        for _ in range(50):
            left = self.pids()
            if not left:
                break
            if self.version == 2 and (self.folders[0] / "cgroup.kill").exists():
                try:
                    (self.folders[0] / "cgroup.kill").write_text("1")
                except OSError:
                    pass
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)
        for folder in self.folders:
            try:
                folder.rmdir()
            except OSError:
                pass


def _oom_killed_v1(folder: Path) -> bool:
    for line in (folder / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1]) > 0
    return int((folder / "memory.failcnt").read_text()) > 0  # an older kernel does not count kills


# ------------------------------------------------------------------------------------ a child

@dataclass
class Settings:
    """One child's limits, in bytes and processes."""

    memory: int
    output: int
    processes: int
    isolate: bool = True
    simulator: bool = True
    cache: int = 256 << 20  # Triton's and Numba's caches: a tmpfs of this size


@dataclass
class Child:
    """One running child process in its sandbox; `requests` (write) and `replies` (read) are the
    grader's ends of its two pipes."""

    proc: subprocess.Popen
    requests: int
    replies: int
    logs: tuple[Path, Path]
    settings: Settings
    cgroup: Cgroup | None
    info: int | None = None
    inner_pid: int | None = None
    pid_namespace: str = ""
    fallback_work: Path | None = None  # the working folder, without isolation
    over: str = ""  # "output", "memory" or "timeout" once a limit was passed (the child is killed)
    closed: bool = field(default=False)
    cpu_limit: float | None = None  # stop it once cpu_seconds() passes this (course.grading.proxy sets it)

    def _read_info(self) -> None:
        if self.info is None:
            return
        ready, _, _ = select.select([self.info], [], [], 0)
        if not ready:
            return
        data = os.read(self.info, 1 << 16)
        os.close(self.info)
        self.info = None
        try:
            parsed = json.loads(data.decode())
            self.inner_pid = int(parsed["child-pid"])
            self.pid_namespace = f"pid:[{int(parsed['pid-namespace'])}]"
        except (ValueError, KeyError, TypeError):
            pass

    def output_bytes(self) -> int:
        total = sum(path.stat().st_size for path in self.logs if path.exists())
        self._read_info()
        if self.inner_pid is not None:
            for inside in ("grading/work", "tmp"):
                try:
                    usage = os.statvfs(f"/proc/{self.inner_pid}/root/{inside}")
                    total += (usage.f_blocks - usage.f_bfree) * usage.f_frsize
                except OSError:
                    pass
        elif self.fallback_work is not None:
            total += _folder_bytes(self.fallback_work)
        return total

    def memory_bytes(self) -> int:
        """The sandbox's processes' proportional set size, added up (only without a cgroup)."""
        self._read_info()
        total = 0
        for pid in self._processes():
            try:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
            except (OSError, ValueError):
                pass
        return total

    def cpu_seconds(self) -> float:
        """The CPU time the submission's processes used, together: the cgroup's accounting where it
        has one, else the process tree's (each live process's user and system time, and that of
        the children it reaped: `tree_cpu_seconds`)."""
        counted = self.cgroup.cpu_seconds() if self.cgroup is not None else None
        if counted is not None:
            return counted
        self._read_info()
        return tree_cpu_seconds(self._processes())

    def _processes(self) -> list[int]:
        if self.pid_namespace:
            found = []
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        if os.readlink(f"/proc/{entry}/ns/pid") == self.pid_namespace:
                            found.append(int(entry))
                    except OSError:
                        pass
            return found
        if self.settings.isolate:  # bubblewrap has not said where its namespace is yet
            return [self.proc.pid]
        return descendants(self.proc.pid)

    def tick(self) -> None:
        """Stop the child once the submission passed its output, memory or CPU time limit."""
        if self.over or self.closed:
            return
        if self.cgroup is not None and self.cgroup.out_of_memory():
            self.over = "memory"
        elif self.output_bytes() > self.settings.output:
            self.over = "output"
        elif self.cgroup is None and self.settings.memory and self.memory_bytes() > self.settings.memory:
            self.over = "memory"
        elif self.cpu_limit is not None and self.cpu_seconds() > self.cpu_limit:
            self.over = "timeout"
        if self.over:
            self.kill()

    def out_of_memory(self) -> bool:
        return self.over == "memory" or (self.cgroup is not None and self.cgroup.out_of_memory())

    @property
    def returncode(self) -> int | None:
        """The child's own end: bwrap reports a signal that killed it as 128 + its number."""
        code = self.proc.returncode
        if self.settings.isolate and code is not None and code > 128:
            return -(code - 128)
        return code

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.kill()
        except OSError:
            pass

    def close(self) -> None:
        """Kill the child and everything it started; free its pipes and cgroup."""
        if self.closed:
            return
        self.kill()
        self.proc.wait()
        for fd in (self.requests, self.replies, self.info):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.info = None
        if self.cgroup is not None:
            self.cgroup.remove()
        self.closed = True


def stat_cpu_ticks(stat: str) -> int:
    """utime + stime + cutime + cstime from a /proc/<pid>/stat line, in clock ticks: the process's
    own CPU time and that of the children it waited for. The command name, in parentheses, may
    hold spaces and parentheses itself: the fields are counted after its last ')'."""
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14))  # fields 14-17 of proc(5), from field 3 on


def tree_cpu_seconds(pids: list[int], read=lambda pid: Path(f"/proc/{pid}/stat").read_text(),
                     ticks_per_second: int | None = None) -> float:
    """The CPU time of these processes, with what each reaped: a process that ended counts once,
    in the parent that waited for it (a sandbox's first process reaps every orphan)."""
    ticks = 0
    for pid in pids:
        try:
            ticks += stat_cpu_ticks(read(pid))
        except (OSError, ValueError, IndexError):
            pass  # it ended meanwhile: its parent counts it
    return ticks / (ticks_per_second or os.sysconf("SC_CLK_TCK"))


def descendants(root: int, listing=lambda: os.listdir("/proc"),
                read=lambda pid: Path(f"/proc/{pid}/stat").read_text()) -> list[int]:
    """root and every live process under it (by parent id)."""
    children: dict[int, list[int]] = {}
    for entry in listing():
        if entry.isdigit():
            try:
                stat = read(int(entry))
                parent = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += [c for c in children.get(pid, []) if c not in found]
    return found


def _folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def start(plan: Plan, code: Path, settings: Settings, logs: tuple[Path, Path], name: str,
          work: Path | None = None) -> Child:
    """Start one child on the lessons under `code` (a folder holding lessons/). Without isolation
    (`settings.isolate` False) it runs as a plain process in `work`."""
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    info_read, info_write = os.pipe() if settings.isolate else (None, None)
    uid = FIRST_UID + next(_uids) % 5000 if os.geteuid() == 0 and settings.isolate else None
    cgroup = Cgroup.create(name, settings.memory, settings.processes) if settings.isolate else None
    limited_as = settings.memory if cgroup is None and settings.simulator else 0
    config = {"requests": request_read, "replies": reply_write, "uid": uid, "file_bytes": settings.output,
              "processes": settings.processes, "address_space": limited_as,
              "path": [str(INSIDE / "harness"), str(INSIDE / "code"), *plan.path] if settings.isolate
              else [str(plan.harness), str(code), *plan.path]}
    child_argv = [plan.python, "-I", "-B", "-c", BOOT, json.dumps(config)]
    passed = [request_read, reply_write]
    if settings.isolate:
        command = _bwrap_command(plan, code, settings, child_argv, info_write, uid is not None)
        passed.append(info_write)
        if cgroup is not None:
            command = ["/bin/sh", "-c", JOIN_CGROUP, "sh", str(len(cgroup.procs)), *cgroup.procs, *command]
        cwd, env = "/", {}
    else:
        cwd, env = str(work), dict(plan.env)
        env["HOME"] = env["TMPDIR"] = str(work)
        for key in ("TRITON_CACHE_DIR", "NUMBA_CACHE_DIR", "MPLCONFIGDIR"):
            env[key] = str(work / ".cache" / key.lower())
    try:
        with open(logs[0], "ab") as out, open(logs[1], "ab") as err:
            proc = subprocess.Popen(command if settings.isolate else child_argv, cwd=cwd, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=passed,
                                    start_new_session=True)
    except BaseException:
        for fd in (request_read, request_write, reply_read, reply_write, info_read, info_write):
            if fd is not None:
                os.close(fd)
        if cgroup is not None:
            cgroup.remove()
        raise
    for fd in (request_read, reply_write, info_write):
        if fd is not None:
            os.close(fd)
    return Child(proc, request_write, reply_read, logs, settings, cgroup, info_read,
                 fallback_work=None if settings.isolate else work)


def _bwrap_command(plan: Plan, code: Path, settings: Settings, child_argv: list[str], info_fd: int,
                   as_root: bool) -> list[str]:
    executable = bwrap()
    if executable is None:
        raise SandboxMissing("bubblewrap (bwrap) is not installed or cannot run here")
    command = [executable, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
               "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
               "--cap-drop", "ALL", "--info-fd", str(info_fd)]
    if as_root:  # only to drop to its own uid before any student code runs (course.grading.child)
        command += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        command += ["--unshare-user"]
    for key, value in plan.env:
        command += ["--setenv", key, value]
    command += ["--size", str(settings.output), "--tmpfs", "/tmp", "--chmod", "1777", "/tmp"]
    made = {"/", "/tmp"}
    for path in plan.binds:
        # bwrap makes missing parents private (0700): the child's own uid could not pass them.
        for parent in reversed(Path(path).parents):
            if str(parent) not in made:
                command += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        if os.path.islink(path) and path in SYSTEM:
            command += ["--symlink", os.readlink(path), path]
        else:
            command += ["--ro-bind", path, path]
        made.add(path)
    for path in plan.hidden:
        command += ["--tmpfs", path]
    command += ["--proc", "/proc", "--dev", "/dev"]
    if plan.gpu:  # after --dev: a bind made before it would lie under the fresh /dev
        command += ["--ro-bind", "/sys", "/sys"]
        for node in sorted(glob.glob("/dev/nvidia*")):
            command += ["--dev-bind", node, node]
    command += ["--perms", "0755", "--dir", str(INSIDE),
                "--ro-bind", str(plan.harness), str(INSIDE / "harness"),
                "--ro-bind", str(code), str(INSIDE / "code"),
                "--size", str(settings.output), "--tmpfs", str(INSIDE / "work"),
                "--chmod", "0777", str(INSIDE / "work"),
                "--size", str(settings.cache), "--tmpfs", str(INSIDE / "cache"),
                "--chmod", "0777", str(INSIDE / "cache"),
                "--chdir", str(INSIDE / "work"), "--", *child_argv]
    return command
