"""Let the kernels that nbval starts import the course from this checkout.

nbval runs each notebook's kernel in notebooks/, where `import course` finds the package only if
it was installed (`pip install -e .`). The kernel inherits this process's environment, so putting
the repository root on PYTHONPATH makes `pytest --nbval-lax notebooks/` work either way.
"""

import os
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if ROOT not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *_paths])

# nbval waits a minute for a notebook's kernel to answer. On a two-core machine running two test
# workers (as `make test` does), starting a kernel beside a busy simulator can take longer than
# that; waiting longer costs nothing when the kernel answers sooner. A value given on the command
# line is kept.
KERNEL_STARTUP_TIMEOUT_S = 300.0
NBVAL_DEFAULT_STARTUP_TIMEOUT_S = 60.0


def pytest_configure(config):
    option = config.option
    if getattr(option, "nbval_kernel_startup_timeout", None) == NBVAL_DEFAULT_STARTUP_TIMEOUT_S:
        option.nbval_kernel_startup_timeout = KERNEL_STARTUP_TIMEOUT_S
