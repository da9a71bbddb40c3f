"""The course's command line:
`python -m course {info,list,check,carry,reveal,bench,figures,sanitize,release,grade,generate}`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from course.core import runtime  # first: choose GPU or simulator before anything imports numba


def _info(args) -> int:
    from course.core.runtime import describe

    print(describe())
    return 0


def _list(args) -> int:
    from .registry import EXERCISES

    for exercise in EXERCISES.values():
        print(f"{exercise.notebook:<18} {exercise.id:<28} {exercise.points:>2} pts  {exercise.summary}")
    return 0


def _check(args) -> int:
    from .carry import check
    from .registry import select

    if args.racecheck:
        from .core.impl import impl_name
        from .sanitize import racecheck

        return racecheck(args.exercise, args.impl or impl_name())
    failed, done = 0, set()
    for exercise in select(args.exercise):
        if exercise.id in done:  # its check was the same run as one above (notebook 12's two exercises)
            continue
        report = check(exercise.id, impl=args.impl, seed=args.seed, full=args.full, raise_on_failure=False,
                       verbose=args.verbose)
        done.update((exercise.id, *report.also))
        failed += not report.passed
    return 1 if failed else 0


def _carry(args) -> int:
    from .carry import carry

    outcome = carry(args.module)
    print(outcome.report(args.module))
    return 0 if outcome.carried or not outcome.by_hand else 1


def _reveal(args) -> int:
    from .answers import reveal

    reveal(args.target)
    return 0


def _bench(args) -> int:
    from course import benchcli

    saved = benchcli.bench(args.topic, args.sections, words=args.options, out=args.out)
    return 2 if saved is None and runtime.SIMULATOR else 0  # a quick pass may save nothing


def _figures(args) -> int:
    from course import benchcli

    benchcli.draw_figures(args.topic, args.results)
    return 0


def _sanitize(args) -> int:
    from course import sanitize

    return sanitize.main(args.options)


def _release(args) -> int:
    from . import release

    if args.through or args.solved:
        if not args.handout:
            raise ValueError("--through and --solved shape a hand-out: pass --handout DIR too")
    if args.handout:
        selection = release.Selection(through=args.through, solved=args.solved)
        written = release.handout(args.handout, selection=selection)
        print(f"wrote the hand-out to {args.handout}: {len(written)} files (no solutions/, no tests/; "
              f"notebook cells tagged {release.HANDOUT_TAG!r} left out; notebooks through "
              f"{args.through or 'the last'}; exercises written through {args.solved or 'none'})")
        return 0
    if args.check:
        problems = release.differences()
        for problem in problems:
            print(problem)
        print("lessons/ is in sync with solutions/" if not problems else
              "lessons/ is out of date: run `python -m course release`")
        return 1 if problems else 0
    edited = release.edited_exercises()
    if edited and not args.force:
        print("lessons/ holds written exercises (their todo lines are gone): " + ", ".join(edited)
              + ".\nReleasing would overwrite that work; pass --force if that is what you want.")
        return 1
    written = release.release()
    print(f"wrote {len(written)} files to lessons/")
    return 0


def _grade(args) -> int:
    from .grading import Limits, grade

    limits = Limits(per_exercise_s=args.timeout_per_exercise, total_s=args.timeout_total,
                    memory_mb=args.memory_mb, output_mb=args.output_mb, processes=args.processes,
                    cache_mb=args.cache_mb)
    grades = grade(args.submissions, args.out, args.seed, exercises=args.exercises, limits=limits,
                   jobs=args.jobs, timing=not args.no_timing, sandbox=not args.no_sandbox)
    flagged = [g for g in grades if g.flags]
    print(f"graded {len(grades)} submissions: {args.out}/gradebook.csv, {args.out}/feedback/"
          + (f"; flagged: {', '.join(f'{g.student} ({chr(59).join(g.flags)})' for g in flagged)}"
             if flagged else ""))
    return 0


def _generate(args) -> int:
    from .capstone.generate import generate_report

    if args.parallel:  # notebook 20: the draft and the target in two processes
        from .capstone import parallel

        print(parallel.generate_report(args.prompt, pair=args.pair, max_new_tokens=args.max_new_tokens,
                                       tree_size=16 if args.tree_size is None else args.tree_size,
                                       width=2 if args.width is None else args.width,
                                       steps=parallel.DEFAULT_STEPS if args.steps is None else args.steps,
                                       mode=args.mode, seed=args.seed, backend=args.backend, impl=args.impl,
                                       critical=args.critical))
        return 0
    if args.critical:
        raise ValueError("--critical is a setting of --parallel (the draft's steps after each re-root)")

    print(generate_report(args.prompt, pair=args.pair, max_new_tokens=args.max_new_tokens, tree=args.tree,
                          tree_size=args.tree_size, width=args.width, branch=args.branch, steps=args.steps,
                          chain=args.chain, mode=args.mode, temperature=args.temperature, seed=args.seed,
                          backend=args.backend, impl=args.impl, progress=not args.no_progress))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="say what runs where (GPU or simulator)").set_defaults(run=_info)
    commands.add_parser("list", help="list the exercises").set_defaults(run=_list)
    check = commands.add_parser("check", help="check exercises against pyspec_ref")
    check.add_argument("exercise", nargs="?", help="an exercise id or a notebook number (default: all)")
    check.add_argument("--impl", choices=("lessons", "solutions"), default=None,
                       help="which copy to check (default: COURSE_IMPL, else lessons)")
    check.add_argument("--seed", type=int, default=0, help="seed of the random cases (default 0)")
    check.add_argument("--full", action="store_true",
                       help="run every case, as grading does (default: the quick default list)")
    check.add_argument("--verbose", action="store_true",
                       help="show the whole traceback of a kernel or launcher that raised")
    check.add_argument("--racecheck", action="store_true",
                       help="on a GPU: run the check under compute-sanitizer's racecheck, which sees the "
                            "races between a block's threads that the CPU cannot show")
    check.set_defaults(run=_check)
    carry = commands.add_parser("carry", help="fill a ladder rung's lesson with your own code of the rung "
                                "it builds on (its `# COPY FROM YOUR` holes)")
    carry.add_argument("module", help="the rung's lesson module, e.g. ladder_k4")
    carry.set_defaults(run=_carry)
    reveal = commands.add_parser("reveal", help="show our reference answer to an exercise, passed or not")
    reveal.add_argument("target", help="an exercise id or a lesson module (e.g. ladder_k4)")
    reveal.set_defaults(run=_reveal)
    bench = commands.add_parser("bench", help="measure a topic on a GPU into results/<device>/<suite>.json")
    bench.add_argument("topic", help="a folder of course/topics/, or capstone")
    bench.add_argument("sections", nargs="*", metavar="section",
                       help="some of the topic's sections (default: all); the committed rows of the "
                            "others are kept")
    bench.add_argument("--out", type=Path, default=None,
                       help="write the results file into this folder instead of results/<device>/")
    bench.set_defaults(run=_bench)
    figures = commands.add_parser("figures",
                                  help="draw a topic's figures from its results, as PNGs beside them")
    figures.add_argument("topic", help="a folder of course/topics/, or capstone")
    figures.add_argument("--results", type=Path, default=None,
                         help="a results file (default: the committed results/<device>/<suite>.json)")
    figures.set_defaults(run=_figures)
    sanitize = commands.add_parser("sanitize", add_help=False,
                                   help="compute-sanitizer (memcheck, racecheck) over every kernel's "
                                        "checks, on a GPU (`python -m course sanitize --help`)")
    sanitize.set_defaults(run=_sanitize)
    release = commands.add_parser("release", help="write lessons/ from solutions/")
    release.add_argument("--check", action="store_true", help="only report whether lessons/ is in sync")
    release.add_argument("--force", action="store_true", help="overwrite written exercises")
    release.add_argument("--handout", metavar="DIR",
                         help="instead, write what students get into DIR (new or empty): the repository "
                              "without solutions/ and tests/, fresh lesson stubs, notebooks without the "
                              "cells that need solutions/")
    release.add_argument("--through", metavar="NN",
                         help="with --handout: only notebooks up to NN (e.g. 06, 11a) and their lessons")
    release.add_argument("--solved", metavar="MM",
                         help="with --handout: the exercises of notebooks up to MM come written, so a "
                              "later rung builds on a finished one (e.g. --through 06 --solved 05)")
    release.set_defaults(run=_release)
    grade = commands.add_parser("grade", help="grade students' submissions (instructors)")
    grade.add_argument("submissions", help="a folder of submissions (repo copies, lessons/ folders, zips)")
    grade.add_argument("--out", required=True, help="where gradebook.csv and feedback/ go")
    grade.add_argument("--seed", type=int, required=True, help="the private seed (keep it out of the repo)")
    grade.add_argument("--exercises", nargs="+", help="exercise ids or notebook numbers (default: all)")
    grade.add_argument("--timeout-per-exercise", type=float, default=600.0,
                       help="seconds of the submission's own CPU time (default 600)")
    grade.add_argument("--timeout-total", type=float, default=3600.0,
                       help="seconds of CPU time per submission (default 3600)")
    grade.add_argument("--memory-mb", type=int, default=8192,
                       help="memory of a submission's processes together (default 8192)")
    grade.add_argument("--output-mb", type=int, default=16,
                       help="cap on what a submission prints and writes, together (default 16)")
    grade.add_argument("--cache-mb", type=int, default=256,
                       help="size of a submission's Triton and Numba caches (default 256)")
    grade.add_argument("--processes", type=int, default=4096,
                       help="processes and threads of a submission together (default 4096)")
    grade.add_argument("--no-sandbox", action="store_true",
                       help="grade without bubblewrap's isolation (where it is missing); every feedback "
                            "file then says so")
    grade.add_argument("--jobs", type=int, default=1, help="submissions graded at once")
    grade.add_argument("--no-timing", action="store_true",
                       help="on a GPU, skip timing passed kernels against the solutions' (never timed "
                            "in the simulator)")
    grade.set_defaults(run=_grade)
    generate = commands.add_parser("generate", help="plain, chain and tree speculative decoding with the "
                                   "capstone's models (notebook 19): text, speed, acceptance")
    generate.add_argument("--prompt", required=True, action="append",
                          help="text to continue (repeat --prompt for a batch)")
    generate.add_argument("--pair", choices=("medium", "small", "tiny"), default=None,
                          help="the trained pair (default: medium on a GPU, tiny in the simulator)")
    generate.add_argument("--max-new-tokens", type=int, default=None,
                          help="tokens per prompt (default: 128 on a GPU, 12 in the simulator)")
    generate.add_argument("--tree", choices=("sequoia", "dynamic", "fixed"), default="sequoia",
                          help="the tree's shape (notebook 21): sequoia (default: the best tree for the "
                               "budget from the pair's measured acceptance), dynamic (EAGLE-2: ranked by the "
                               "draft's confidence) or fixed (the capstone's first tree)")
    generate.add_argument("--tree-size", type=int, default=None,
                          help="nodes verified per target call (bs; sequoia: the budget; default 48)")
    generate.add_argument("--width", type=int, default=None,
                          help="nodes the draft expands per step (w; sequoia derives it)")
    generate.add_argument("--branch", type=int, default=None,
                          help="children of each node the draft runs (sequoia derives it)")
    generate.add_argument("--steps", type=int, default=None,
                          help="draft steps per round: the tree's depth (sequoia: its depth limit); with "
                               "--parallel, the steps taken while the target verifies (d, default 2)")
    generate.add_argument("--critical", type=int, default=0,
                          help="with --parallel: the draft's steps after each re-root, on the critical path "
                               "(notebook 20 §8 measures 0 to 4; default 0)")
    generate.add_argument("--chain", type=int, default=5, help="tokens the chain drafts per round (k)")
    generate.add_argument("--mode", choices=("greedy", "sample"), default="greedy")
    generate.add_argument("--temperature", type=float, default=1.0,
                          help="sampling temperature (> 0; sample mode only)")
    generate.add_argument("--seed", type=int, default=0, help="seed of the sampling uniforms")
    generate.add_argument("--backend", choices=("kernels", "reference"), default="kernels",
                          help="the course's kernels (default) or the torch reference")
    generate.add_argument("--impl", choices=("lessons", "solutions"), default=None,
                          help="which copy of the kernels (default: COURSE_IMPL, else lessons)")
    generate.add_argument("--no-progress", action="store_true", help="no progress bar")
    generate.add_argument("--parallel", action="store_true",
                          help="SwiftSpec's parallel tree generation (notebook 20): the draft and the "
                               "target in two processes, on two GPUs (in the simulator: on the CPU, through "
                               "gloo); one prompt")
    generate.set_defaults(run=_generate)
    args, rest = parser.parse_known_args(argv)
    if args.command == "sanitize":  # its own options: `python -m course sanitize --help`
        args.options = rest
    elif args.command == "bench":  # a room's own options (the capstone's: course/capstone/bench.py)
        args.options = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from course.core.impl import SolutionsMissing

    try:
        return args.run(args)
    except (ValueError, SolutionsMissing) as error:  # SolutionsMissing: --impl solutions in a hand-out
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m course list | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
