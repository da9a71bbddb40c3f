"""Where the course's kernels run: a CUDA GPU, or Numba's CUDA simulator and Triton's interpreter.

The choice is made once, when `course` is first imported, because Numba reads
`NUMBA_ENABLE_CUDASIM` when it is first imported and Triton reads `TRITON_INTERPRET`
when a kernel is decorated. So a notebook imports `course` before anything else.

- `COURSE_SIM=1` forces the simulator, `COURSE_SIM=0` insists on a GPU;
- unset, the simulator is used exactly when PyTorch sees no CUDA GPU.
"""

from __future__ import annotations

import os
import sys

from course.core import venv

SIM_ENV = "COURSE_SIM"


class RuntimeSetupError(RuntimeError):
    """The process was started in a way that would silently run on the wrong backend."""


def _torch_sees_gpu() -> bool:
    import torch  # importing torch does not import numba, so the choice is still open

    return torch.cuda.is_available()


def _wants_simulator() -> bool:
    forced = os.environ.get(SIM_ENV, "").strip()
    if forced not in ("", "0", "1"):
        raise RuntimeSetupError(f"{SIM_ENV} must be 0, 1 or unset, got {forced!r}")
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" and forced != "0":
        return True  # the user already asked Numba for its simulator
    if forced == "1":
        return True
    has_gpu = _torch_sees_gpu()
    if forced == "0" and not has_gpu:
        raise RuntimeSetupError(
            f"{SIM_ENV}=0 asks for a CUDA GPU, but PyTorch sees none "
            "(torch.cuda.is_available() is False). Unset it to use the simulator."
        )
    return not has_gpu


def _configure() -> bool:
    venv.require_packages()  # a Python outside the course's .venv is told so, not 'No module named torch'
    simulate = _wants_simulator()
    numba_env = os.environ.get("NUMBA_ENABLE_CUDASIM")
    if "numba" in sys.modules and (numba_env == "1") != simulate:
        wanted = "the CUDA simulator" if simulate else "the real CUDA driver"
        raise RuntimeSetupError(
            f"numba was imported before course, so it cannot be switched to {wanted}. "
            "Restart the kernel (or the interpreter) and import course before numba."
        )
    if "triton" in sys.modules and simulate and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeSetupError(
            "triton was imported before course, so its interpreter cannot be switched on. "
            "Restart the kernel and import course before triton."
        )
    flag = "1" if simulate else "0"
    os.environ["NUMBA_ENABLE_CUDASIM"] = flag
    os.environ["TRITON_INTERPRET"] = flag
    return simulate


SIMULATOR: bool = _configure()
MODE: str = "simulator" if SIMULATOR else "gpu"


def on_gpu() -> bool:
    """True when kernels run on a real CUDA GPU."""
    return not SIMULATOR


def torch_device():
    """The torch device that kernel inputs live on: cuda on a GPU, cpu in the simulator."""
    import torch

    return torch.device("cpu" if SIMULATOR else "cuda")


def _small_sizes() -> bool:
    sizes = os.environ.get("COURSE_SIZES", "full")
    if sizes not in ("small", "full"):
        raise ValueError(f"COURSE_SIZES must be 'small' or 'full', got {sizes!r}")
    return SIMULATOR or sizes == "small"


# COURSE_SIZES=small gives a GPU the simulator's problem sizes: compute-sanitizer runs
# kernels a hundred times slower, and the small cases still cover every edge case.
SMALL_SIZES: bool = _small_sizes()


def pick(*, sim, gpu):
    """A problem size (or any setting) for this runtime: tiny in the simulator (or with
    COURSE_SIZES=small), real on a GPU."""
    return sim if SMALL_SIZES else gpu


def device_name() -> str:
    if SIMULATOR:
        return "Numba CUDA simulator + Triton interpreter (CPU)"
    import torch

    return torch.cuda.get_device_name()


def software_versions() -> dict[str, str]:
    import importlib.metadata as md

    versions = {"python": sys.version.split()[0]}
    for package in ("torch", "triton", "numba", "numba-cuda", "numpy"):
        try:
            versions[package] = md.version(package)
        except md.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


KERNEL_SOURCES = {
    "lessons": "your own code; set COURSE_IMPL=solutions to run the reference solutions",
    "solutions": "the reference solutions; unset COURSE_IMPL to run your lessons/",
}


def describe() -> str:
    """A few lines saying what runs where; notebook 00 prints it."""
    from course.core import impl

    lines = [
        f"runtime : {MODE} ({device_name()})",
        f"kernels : {impl.impl_name()}/  ({KERNEL_SOURCES[impl.impl_name()]})",
        "software: " + ", ".join(f"{k} {v}" for k, v in software_versions().items()),
    ]
    if SIMULATOR:
        lines.append(
            "note    : the simulator runs ~1M multiply-adds/s, so problem sizes are tiny here; "
            "timings are read from committed GPU measurements."
        )
    return "\n".join(lines)
