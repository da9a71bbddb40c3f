"""Sample submission: importing it fails (a misspelled module)."""

import numpyy  # noqa: F401  (no such module: the import fails)

from ._solution_trees import *  # noqa: F403
