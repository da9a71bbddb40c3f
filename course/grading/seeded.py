"""Which of an exercise's cases draw their inputs from the seed, and the weights that follow.

A check's case list mixes fixed public cases (a chain, a star, the notebook's examples: a
student sees them run in the notebook) with cases drawn from the seed. A submission that only
answers the public cases (a lookup table) must not earn most of the points, so grading weighs the
cases: the seeded ones share SEEDED_SHARE of the exercise's points, the fixed ones the rest.

Which case is which is found, not declared: each case is run up to the first call it makes of
the graded module, on a module that records that call's arguments instead of running it
(`first_calls`), once for each of two seeds. A case whose first call's arguments differ between
the two is seeded. Nothing runs but the check's own input building, in the grader.
"""

from __future__ import annotations

import hashlib

from . import proxy, wire

SEEDED_SHARE = 2 / 3  # of an exercise's points, when it has both kinds of case
OTHER_SEED = 0x5EED_0F_0DD5  # the second seed a case's inputs are drawn from, to see them change


class _Called(BaseException):  # noqa: N818  (not an error: the recorded call ends the case's run)
    def __init__(self, digest: str):
        super().__init__(digest)
        self.digest = digest


class _Recorder:
    """Stands in for a grading child: a call's arguments become a digest, and the case stops there."""

    def call(self, module, name, args, kwargs, name_of, resolve, callbacks, outputs=None, blocks=None):
        try:
            data = wire.frame({"name": name}, name_of, args=list(args), kwargs=kwargs)
        except TypeError:
            data = repr((name, args, kwargs)).encode()
        raise _Called(hashlib.sha256(data).hexdigest())


def first_calls(exercise, setup, seed: int) -> list[tuple[str, str | None]]:
    """(case name, digest of the arguments of its first call of the graded module, or None)."""
    name = exercise.module
    module = proxy.ProxyModule(name, setup.trusted[name], setup.remote[name], setup.kernels[name], {},
                               _Recorder(), setup.trusted)
    found = []
    for case, run in exercise.selected_cases(module, seed, full=True):
        try:
            run()
            found.append((case, None))
        except _Called as called:
            found.append((case, called.digest))
        except Exception:  # noqa: BLE001  (a case that stops before calling the module: not seeded)
            found.append((case, None))
    return found


def seeded_cases(exercise, setup, seed: int) -> set[str]:
    """The names of the exercise's cases whose inputs come from the seed."""
    first, second = first_calls(exercise, setup, seed), first_calls(exercise, setup, seed ^ OTHER_SEED)
    if [case for case, _ in first] != [case for case, _ in second]:
        # the names themselves depend on the seed: a case is seeded where its name or inputs moved
        fixed = {pair for pair in first if pair[1] is not None} & set(second)
        return {case for case, digest in first if (case, digest) not in fixed}
    return {case for (case, digest), (_, other) in zip(first, second, strict=True)
            if digest is not None and digest != other}


def weights(cases: list[str], seeded: set[str]) -> list[float]:
    """Each case's share of the exercise's points: SEEDED_SHARE split over the seeded cases and the
    rest over the fixed ones (equal shares when there is only one kind)."""
    drawn = [case in seeded for case in cases]
    n_seeded = sum(drawn)
    n_fixed = len(cases) - n_seeded
    if not n_seeded or not n_fixed:
        return [1 / len(cases)] * len(cases) if cases else []
    return [SEEDED_SHARE / n_seeded if d else (1 - SEEDED_SHARE) / n_fixed for d in drawn]
