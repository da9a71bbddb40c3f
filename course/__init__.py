"""SpecKernels' harness: runtime, inputs, checks, timing, plots, release and grading.

Import this package first in a notebook: it decides between GPU and simulator
before Numba or Triton is loaded (see `course.runtime`).
"""

from . import runtime  # noqa: I001  (must run before anything imports numba or triton)
from .runtime import MODE, SIMULATOR, describe, on_gpu, pick, torch_device

__all__ = ["MODE", "SIMULATOR", "describe", "on_gpu", "pick", "torch_device"]
