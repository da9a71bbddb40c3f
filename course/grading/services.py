"""What the grading child's launch code asks the grader to run: the specification's validators.

The child holds no answer (course.grading.sandbox): neither `pyspec_ref` nor `course.oracle` is in
its harness. A few launchers still need a function of theirs: the specification's own checks of
their inputs (so that the messages are the specification's), the flattened layout DeFT's launcher
tunes with, and the dense mask the dense rung's launcher hands its kernel. In the child, those
names are stand-ins (`stand_in_sources`) that send their arguments to the grader, which runs the
real function here, in its own process, and sends back the result or the error.

The grader runs only what `SERVICES` lists, and each only where the table allows it: during a call
of any lesson module (`ANY`), only during a call of the modules named (the dense mask is an
answer of notebook 01, so only the dense rung's own launcher, which builds it anyway, gets it), or
only while a passed exercise is timed (`TIMING`: the benchmark's inputs, built after every case
has been graded). Anything else a child asks for is refused: a hole that runs arbitrary code finds
no specification to read and no grader that computes an answer for it.
"""

from __future__ import annotations

import importlib

ANY = "any call"
TIMING = "timing"
MAX_MASK_ELEMENTS = 1 << 26  # the dense mask a child may ask for (64 MB of bools)


def _dense_mask_size(start, end=None) -> int:
    shape = tuple(getattr(start, "shape", ()))
    return (shape[0] if len(shape) == 2 else 1) * (shape[-1] ** 2 if shape else 0)


# name -> (where it is served, a guard on the arguments: their result's size)
SERVICES = {
    "pyspec_ref.trees.validate_times": (ANY, None),
    "pyspec_ref.deft.validate_kv_tree": (ANY, None),
    "pyspec_ref.deft.token_offsets": (ANY, None),
    "course.oracle.dense_tree_mask": (frozenset({"ladder_dense"}) | {TIMING}, _dense_mask_size),
    # the benchmark's trees (course.core.inputs), only while a passed exercise is timed
    "pyspec_ref.chain_parents": (frozenset({TIMING}), None),
    "pyspec_ref.relabel": (frozenset({TIMING}), None),
    "pyspec_ref.dfs_order": (frozenset({TIMING}), None),
    "pyspec_ref.dfs_times": (frozenset({TIMING}), None),
}
# Plain numbers the launchers read: copied into the stand-ins as they are.
CONSTANTS = ("pyspec_ref.sampling.NORMALISATION_TOLERANCE",)
# Errors a stand-in raises as such in the child (a launcher's refusal); anything else a RuntimeError.
ERRORS = ("ValueError", "TypeError", "IndexError")


class Refused(RuntimeError):
    """A service the child may not have here."""


def _function(name: str):
    module, _, attribute = name.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def run(name: str, scope: str, args: list, kwargs: dict):
    """Run service `name` for a child busy with `scope` (a lesson module's name, or TIMING)."""
    where, guard = SERVICES.get(name, (None, None)) if isinstance(name, str) else (None, None)
    if where is None or (where != ANY and scope not in where):
        raise Refused(f"grading does not run {str(name)[:80]!r} for the code it grades here")
    if guard is not None and guard(*args, **kwargs) > MAX_MASK_ELEMENTS:
        raise Refused(f"{name}: arguments larger than a launcher ever passes")
    return _function(name)(*args, **kwargs)


def stand_in_sources() -> dict[str, str]:
    """The child's stand-in modules, as relative path -> source: each listed function a call to the
    grader (course.grading.child.ask_grader), each constant its value."""
    by_module: dict[str, list[str]] = {}
    for name in [*SERVICES, *CONSTANTS]:
        module, _, attribute = name.rpartition(".")
        by_module.setdefault(module, [])
        if name in CONSTANTS:
            by_module[module].append(f"{attribute} = {_function(name)!r}\n")
        else:
            by_module[module].append(f"\n\ndef {attribute}(*args, **kwargs):\n"
                                     f"    return ask_grader({name!r}, args, kwargs)\n")
    for module in list(by_module):  # every package on the way (but course/, the harness's own)
        parts = module.split(".")
        for depth in range(1, len(parts)):
            if parts[:depth] != ["course"]:
                by_module.setdefault(".".join(parts[:depth]), [])
    sources = {}
    for module, body in sorted(by_module.items()):
        is_package = any(other.startswith(module + ".") for other in by_module)
        path = module.replace(".", "/") + ("/__init__.py" if is_package else ".py")
        header = (f'"""The grading child\'s stand-in for {module}: what launch code needs of it, run by '
                  'the grader (course.grading.services)."""\n\n')
        uses = "from course.grading.child import ask_grader\n" if any("ask_grader" in b for b in body) else ""
        sources[path] = header + uses + "".join(body)
    return sources
