"""Install the course into a virtual environment: what `make lab` and `make test` run first.

Standard library only, so that it runs on a bare Python before anything is installed.

    python3 tools/install.py install --venv .venv --extras dev [--gpu auto|0|1] [--system-torch]
    python3 tools/install.py resolve        # can the public package index satisfy the pins?

Which PyTorch build it installs:
- no NVIDIA GPU (or `--gpu 0`): torch's small CPU build from PyTorch's CPU wheel index, when that
  index answers within a few seconds; otherwise whatever the configured index serves (a machine
  whose pip configuration holds a local CPU wheel, say). Triton comes from the course's own
  requirement: the interpreter runs Triton kernels on the CPU.
  With the dev extra, the `ptx` extra too: NVVM and NVRTC, so that the tests compile the Numba
  kernels to PTX as a GPU would.
- an NVIDIA GPU (`nvidia-smi -L` lists one, or `--gpu 1`): torch's CUDA build from the package
  index, which names its own Triton, and the `gpu` extra (numba-cuda's NVVM and NVRTC for the
  CUDA major version of that torch).
- `--system-torch`: the venv sees the system's packages and keeps the torch it finds there, if
  that torch lies in the course's range.

The stamp `<venv>/.installed-<mode>` is written last, after every step succeeded, so `make`
never trusts a venv whose install broke off; a venv without it (or with another mode's) is
rebuilt from scratch.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUPPORTED_PYTHON = ((3, 11), (3, 15))  # from 3.11 up to, not including, 3.15 (torch 2.13's limit)
CPU_INDEX = os.environ.get("TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")
PUBLIC_INDEX = "https://pypi.org/simple"
PROBE_SECONDS = 5
# numba-cuda's CUDA extra must match the CUDA major version that torch was built for.
GPU_EXTRA_BY_CUDA_MAJOR = {"13": "gpu", "12": "gpu-cu12"}


class InstallError(Exception):
    """Something the user must fix; the message says what and how."""


def say(message: str) -> None:
    print(f"[install] {message}", flush=True)


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    say("$ " + " ".join(command))
    return subprocess.run(command, check=True, **kwargs)


# ---- what the course asks for ----------------------------------------------------------------

def requirement(name: str) -> str:
    """The course's requirement on `name`, read from pyproject.toml (the one place pins live)."""
    import tomllib  # here, not at the top: on Python < 3.11 the version check must speak first

    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for spec in dependencies:
        if re.match(rf"{re.escape(name)}\s*[<>=!~;\[]", spec):
            return spec.split(";")[0].strip()
    raise InstallError(f"pyproject.toml has no requirement on {name}")


def release(version: str) -> tuple[int, ...]:
    """(2, 11, 0) for '2.11.0+cu130' or '2.12.0rc1': the release numbers alone."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def admits(spec: str, version: str) -> bool:
    """Whether `version` meets every `>=`, `<`, `<=`, `>` and `==` clause of `spec`."""
    have = release(version)
    for operator, bound in re.findall(r"(>=|<=|==|<|>)\s*([\d.]+)", spec):
        want = release(bound)
        padded = have[:len(want)] + (0,) * max(0, len(want) - len(have))
        ok = {">=": padded >= want, "<=": padded <= want, "==": padded == want,
              "<": padded < want, ">": padded > want}[operator]
        if not ok:
            return False
    return True


# ---- the machine -----------------------------------------------------------------------------

# numba-cuda (the simulator included) publishes wheels for Linux and Windows, Triton for Linux only.
UNSUPPORTED_PLATFORMS = {
    "darwin": "macOS: numba-cuda (which holds the CUDA simulator) and Triton publish no macOS wheels. "
              "Run the course on a Linux machine, in a Linux VM or container, or in a cloud notebook",
    "win32": "Windows: Triton publishes no Windows wheels and `make` needs a POSIX shell. Run the course "
             "in WSL 2 (Ubuntu), where it installs as on Linux, with the GPU if WSL's NVIDIA driver is there",
}


def check_platform(platform: str) -> None:
    for prefix, why in UNSUPPORTED_PLATFORMS.items():
        if platform.startswith(prefix) or (prefix == "win32" and platform in ("cygwin", "msys")):
            raise InstallError(why)


def check_python(python: str) -> str:
    found = subprocess.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise InstallError(f"cannot run {python!r}; name a Python ≥ 3.11 with PYTHON=..., "
                           "for example `make lab PYTHON=python3.12`")
    version = found.stdout.strip()
    low, high = SUPPORTED_PYTHON
    if not low <= release(version)[:2] < high:
        raise InstallError(
            f"{python} is Python {version}; the course needs Python 3.{low[1]} to 3.{high[1] - 1}. "
            f"Install one and name it, for example `make lab PYTHON=python3.12`")
    return version


def has_nvidia_gpu() -> bool:
    """`nvidia-smi -L` lists at least one GPU: the driver is there and sees a card."""
    if shutil.which("nvidia-smi") is None:
        return False
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return listed.returncode == 0 and "GPU" in listed.stdout


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=PROBE_SECONDS):
            return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def system_torch(python: str) -> tuple[str, str | None]:
    """(version, CUDA version or None) of the torch that `python` imports."""
    probe = "import torch; print(torch.__version__); print(torch.version.cuda or '')"
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if found.returncode != 0:
        raise InstallError(f"SYSTEM_TORCH=1, but {python} cannot import torch. Install torch "
                           f"({requirement('torch')}) there, or drop SYSTEM_TORCH=1 to install it "
                           "into the venv")
    version, cuda = (found.stdout.strip().splitlines() + [""])[:2]
    return version, cuda or None


# ---- the install -----------------------------------------------------------------------------

def mode_name(gpu: bool, keep_system_torch: bool) -> str:
    return ("system-" if keep_system_torch else "") + ("gpu" if gpu else "cpu")


def fresh_venv(venv: Path, python: str, keep_system_torch: bool) -> Path:
    if venv.exists():
        say(f"building {venv} again from scratch: its install is older than pyproject.toml or this "
            "script, did not finish, or was of another kind (GPU, SYSTEM_TORCH)")
        shutil.rmtree(venv)
    command = [python, "-m", "venv", str(venv)]
    if keep_system_torch:
        command.append("--system-site-packages")
    run(command)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    run(pip + ["install", "--quiet", "--upgrade", "pip"])
    return venv / "bin" / "python"


def install_cpu_torch(venv_python: Path) -> None:
    torch = requirement("torch")
    if reachable(f"{CPU_INDEX}/torch/"):
        run([str(venv_python), "-m", "pip", "install", torch, "--index-url", CPU_INDEX,
             "--extra-index-url", PUBLIC_INDEX])
    else:
        say(f"PyTorch's CPU wheel index ({CPU_INDEX}) did not answer within {PROBE_SECONDS} s: "
            "taking torch from the configured package index instead")
        run([str(venv_python), "-m", "pip", "install", torch])


def gpu_extra(venv_python: Path) -> str:
    version, cuda = system_torch(str(venv_python))
    major = (cuda or "").split(".")[0]
    if major not in GPU_EXTRA_BY_CUDA_MAJOR:
        raise InstallError(f"torch {version} was built {'for CUDA ' + cuda if cuda else 'without CUDA'}; "
                           f"the GPU install needs a CUDA 12 or 13 build. Install one, or use GPU=0")
    return GPU_EXTRA_BY_CUDA_MAJOR[major]


def verify(venv_python: Path, gpu: bool) -> None:
    """Import what the course needs; on a GPU machine, insist that torch can use the GPU."""
    imports = "import torch, numba, numpy, matplotlib; import numba.cuda"
    if sys.platform.startswith("linux"):
        imports += "; import triton"
    run([str(venv_python), "-c", imports])
    if not gpu:
        return
    probe = ("import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())")
    found = subprocess.run([str(venv_python), "-c", probe], capture_output=True, text=True, check=True)
    version, cuda, usable = found.stdout.split()
    if usable != "True":
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip() or "unknown"
        raise InstallError(
            f"nvidia-smi sees a GPU (driver {driver}), but torch {version} (built for CUDA {cuda}) "
            "cannot use it: the driver is probably older than that CUDA version needs. Update the "
            "NVIDIA driver, or keep a torch that works with it (`make lab SYSTEM_TORCH=1`), or run "
            "the simulators (`make lab GPU=0`)")


def strip_outputs_on_commit(venv_python: Path) -> None:
    """Point the repository's nbstripout filter (.gitattributes) at the venv: running a notebook
    then leaves `git status` clean, and a `git pull` meets no conflicts in outputs. Cell ids are
    kept, and language_info goes (Jupyter rewrites it on every save)."""
    inside = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-inside-work-tree"],
                            capture_output=True, text=True)
    if inside.returncode != 0:
        return  # a copy without git (a hand-out as a zip, say): nothing to configure
    clean = f"'{os.path.abspath(venv_python)}' -m nbstripout --keep-id --extra-keys metadata.language_info"
    for key, value in (("clean", clean), ("smudge", "cat")):
        run(["git", "-C", str(ROOT), "config", f"filter.nbstripout.{key}", value])
    run(["git", "-C", str(ROOT), "config", "diff.ipynb.textconv", f"{clean} -t"])


def install(args: argparse.Namespace) -> None:
    gpu = {"1": True, "0": False}.get(args.gpu, None)
    if gpu is None:
        gpu = has_nvidia_gpu()
    check_platform(sys.platform)
    python_version = check_python(args.python)
    mode = mode_name(gpu, args.system_torch)
    keeping = ", keeping the system torch" if args.system_torch else ""
    say(f"Python {python_version}, {'NVIDIA GPU' if gpu else 'no GPU'}{keeping}: "
        f"installing the '{mode}' set into {args.venv}")
    if args.system_torch:
        version, cuda = system_torch(args.python)
        if not admits(requirement("torch"), version):
            raise InstallError(f"SYSTEM_TORCH=1: {args.python}'s torch is {version}, outside the course's "
                               f"range {requirement('torch')}. Upgrade it, or drop SYSTEM_TORCH=1")
        say(f"keeping the system's torch {version}" + (f" (CUDA {cuda})" if cuda else " (CPU build)"))

    venv = Path(args.venv)
    venv_python = fresh_venv(venv, args.python, args.system_torch)  # any earlier stamp goes with it
    if not gpu and not args.system_torch:
        install_cpu_torch(venv_python)
    extras = [extra for extra in args.extras.split(",") if extra]
    if gpu:
        if not args.system_torch:
            run([str(venv_python), "-m", "pip", "install", requirement("torch")])
        extras.append(gpu_extra(venv_python))
    elif "dev" in extras:
        extras.append("ptx")  # NVVM without a GPU: the tests compile the Numba kernels to PTX
    target = f"{ROOT}[{','.join(extras)}]" if extras else str(ROOT)
    run([str(venv_python), "-m", "pip", "install", "-e", target])
    verify(venv_python, gpu)
    strip_outputs_on_commit(venv_python)  # the path inside the venv, not the interpreter it links to
    (venv / f".installed-{mode}").write_text(mode + "\n")
    say(f"done: {args.venv} holds the '{mode}' set")


def resolve(args: argparse.Namespace) -> None:
    """Resolve the CPU and the GPU sets against the public index alone, ignoring any local pip
    configuration (local wheels, constraints), as a student's machine would: metadata only.

    It runs a current pip in a throwaway venv: older pips download whole wheels to read their
    metadata (torch's are 0.5 GB) and mis-resolve extras of extras (numba-cuda[cu13] ->
    cuda-toolkit[nvvm]), so they reject sets that a current pip installs."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    environment["PIP_CONFIG_FILE"] = os.devnull
    pip_install = ["-m", "pip", "--isolated", "--disable-pip-version-check", "install", "--quiet",
                   "--index-url", PUBLIC_INDEX]
    with tempfile.TemporaryDirectory(prefix="course-resolve-") as folder:
        resolver = Path(folder) / "bin" / "python"
        run([args.python, "-m", "venv", folder])
        run([str(resolver), *pip_install, "--upgrade", "pip"], env=environment)
        for name, extras in (("CPU", "dev,ptx"), ("GPU", "dev,gpu")):
            say(f"resolving the {name} set (.[{extras}]) against {PUBLIC_INDEX} alone")
            run([str(resolver), *pip_install, "--dry-run", "--ignore-installed", "-e", f"{ROOT}[{extras}]"],
                env=environment)


def main(argv: list[str] | None = None) -> int:
    if sys.version_info < SUPPORTED_PYTHON[0]:
        print(f"[install] cannot install: this is Python {sys.version.split()[0]}; the course needs "
              "Python 3.11 or newer. Install one and name it, for example `make lab PYTHON=python3.12`",
              file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    install_parser = commands.add_parser("install", help="create the venv and install the course")
    install_parser.add_argument("--venv", default=".venv")
    install_parser.add_argument("--python", default=sys.executable, help="the Python the venv is made from")
    install_parser.add_argument("--extras", default="dev", help="comma-separated extras of pyproject.toml")
    install_parser.add_argument("--gpu", default="auto", choices=["auto", "0", "1"])
    install_parser.add_argument("--system-torch", action="store_true",
                                help="keep the torch of --python (the venv sees the system's packages)")
    resolve_parser = commands.add_parser("resolve", help="resolve both sets against the public index")
    resolve_parser.add_argument("--python", default=sys.executable, help="the Python whose pip resolves")
    args = parser.parse_args(argv)
    try:
        install(args) if args.command == "install" else resolve(args)
    except InstallError as error:
        print(f"\n[install] cannot install: {error}\n", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as error:
        if args.command == "install":
            after = "the venv is left without its stamp, so the next `make` starts again"
        else:
            after = "the public index cannot satisfy the pins in pyproject.toml (pip's message is above)"
        command = " ".join(map(str, error.cmd))
        print(f"\n[install] failed: `{command}` exited with {error.returncode}; {after}\n", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
