"""The fuzz suite's settings: seeded (derandomized) hypothesis runs, 30 examples per target in the
simulator and 100 on a GPU (FUZZ_EXAMPLES overrides both).

`course` is imported before anything loads numba or triton (tests/conftest.py imports it first;
hypothesis loads neither), so that they pick the GPU or the simulator. On a GPU:
`COURSE_SIM=0 python -m pytest tests/fuzz` (the tensors then live on the GPU).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

import course  # noqa: F401  (first: picks GPU or simulator)
from course.core import runtime

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0")) or (30 if runtime.SIMULATOR else 100)

settings.register_profile(
    "fuzz",
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
