"""The fuzz suite's settings: seeded (derandomized) hypothesis runs, few examples in the simulator.

`course` is imported first (tests/conftest.py does it too), so that numba and triton pick the GPU or
the simulator before they load. FUZZ_EXAMPLES overrides the number of examples per target.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

import course  # noqa: F401  (first: picks GPU or simulator)
from course import runtime

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
