"""SpecKernels' harness: runtime, inputs, checks, timing, plots, release and grading.

Import this package first in a notebook: it decides between GPU and simulator
before Numba or Triton is loaded (see `course.core.runtime`).
"""

from .core import runtime  # noqa: I001  (must run before anything imports numba or triton)
from .core.runtime import MODE, SIMULATOR, describe, on_gpu, pick, torch_device
from . import checks, registry  # none of these imports numba
from .core import impl, inputs
from .carry import check  # the registry's check, then carrying a passed rung into the next
from . import answers
from .answers import compare_with_ours, reveal

__all__ = ["MODE", "SIMULATOR", "answers", "check", "checks", "compare_with_ours", "describe", "impl",
           "inputs", "on_gpu", "pick", "registry", "reveal", "runtime", "torch_device"]
