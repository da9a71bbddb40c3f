"""Test setup: import course first, so that it picks GPU or simulator before numba loads."""

import course  # noqa: F401
