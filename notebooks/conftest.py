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
