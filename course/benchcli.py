"""`python -m course bench <topic> [sections]` and `python -m course figures <topic>`.

Every room that measures on a GPU (each `course/topics/<topic>/` and `course/capstone/`) answers
to the same contract, so that these two commands are the only way to run a bench or draw its
figures:

* `<room>.bench` has `SUITE` (its file, results/<device>/<SUITE>.json; a topic's is the room's name),
  `SECTIONS` (name -> a function that measures and returns rows, never draws) and `section_of(row)`
  (the section that measured a committed row);
* `<room>.figures` has `FIGURES` (PNG name -> a function drawing one Figure from the results
  document) and may have `summary(document)`, a text of the paper's targets met or missed.

A bench refuses the simulator (its times say nothing about a GPU); figures read committed JSON,
so they draw on any machine. `--out DIR` writes a bench's file into DIR instead of results/<device>/.

A bench may also have (the capstone's does):
* `DEFAULT_SECTIONS`, the sections measured when none is named (otherwise all of them);
* `add_options(parser)`, options of its own on the command line after the sections: each section then
  gets them, and `out`, as keyword arguments;
* `SAVED_APART` (section -> save(rows, options) -> the path written, or None), for a section whose
  rows go to a results file of its own rather than to `<SUITE>.json`.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from course import topics as topic_rooms
from course.core import runtime
from course.measure import results
from course.measure.plots import save_figures

SIMULATOR_REFUSAL = ("`python -m course bench` measures a GPU, and this machine runs the simulator, whose "
                     "times say nothing about one; the committed measurements are in results/<device>/")
# The capstone measures like a topic but is a room of its own (notebook 19 puts every topic together).
ROOMS_OUTSIDE_TOPICS = {"capstone": "course.capstone"}


class UsageError(ValueError):
    """A topic or section that does not exist (the command line prints it and exits with 2)."""


def rooms() -> dict[str, str]:
    """Every room with a bench and figures: topic name -> its package (`course.topics.names`)."""
    return {topic: f"course.topics.{topic}" for topic in topic_rooms.names()} | ROOMS_OUTSIDE_TOPICS


def part_of(room: str, part: str) -> ModuleType:
    """`<room>.<part>` (part: "bench" or "figures") imported; UsageError for an unknown room."""
    packages = rooms()
    if room not in packages:
        raise UsageError(f"topic must be one of {', '.join(packages)}; got {room!r}")
    return importlib.import_module(f"{packages[room]}.{part}")


def chosen_sections(sections: Sequence[str], named: Sequence[str]) -> list[str]:
    """The sections named (all of `sections` when none is); an unknown one is a UsageError."""
    chosen = list(named) or list(sections)
    unknown = [section for section in chosen if section not in sections]
    if unknown:
        raise UsageError(f"sections must be some of {', '.join(sections)}; got {', '.join(unknown)}")
    return chosen


def room_options(module: ModuleType, room: str, words: Sequence[str], out: Path | None) -> dict:
    """The keyword arguments of a room's sections: none, or (a bench with `add_options`) its options
    parsed from `words` and `out`; words a bench does not take are a UsageError."""
    if not hasattr(module, "add_options"):
        if words:
            raise UsageError(f"the {room} bench takes no options; got {' '.join(words)}")
        return {}
    parser = argparse.ArgumentParser(prog=f"python -m course bench {room}", add_help=False)
    module.add_options(parser)
    parsed, unknown = parser.parse_known_args(list(words))
    if unknown:
        raise UsageError(f"the {room} bench does not take {' '.join(unknown)} (sections first, then "
                         f"options); {parser.format_usage()}")
    return dict(vars(parsed), out=out)


def bench(room: str, named: Sequence[str] = (), log=print, words: Sequence[str] = (),
          out: Path | None = None) -> Path | None:
    """Measure the chosen sections of a room's bench and save them with this device's committed
    rows of the other sections (into `out` if given); None (after saying why) in the simulator.
    `words`: the command line's options after the sections, for a bench with `add_options`."""
    module = part_of(room, "bench")
    sections = chosen_sections(module.SECTIONS, named or getattr(module, "DEFAULT_SECTIONS", ()))
    options = room_options(module, room, words, out)
    if runtime.SIMULATOR:
        log(SIMULATOR_REFUSAL)
        return None
    import torch

    torch._dynamo.config.cache_size_limit = 64  # FlexAttention compiles once per shape and dtype
    kept = results.kept_rows(module.SUITE, lambda row: module.section_of(row) not in sections)
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    rows, path = [], None
    for section in sections:
        measured = [dict(row, run=stamp) for row in module.SECTIONS[section](**options)]
        save_apart = getattr(module, "SAVED_APART", {}).get(section)
        if save_apart is not None:
            path = save_apart(measured, options)
        else:
            rows += measured
            path = results.save(module.SUITE, kept + rows, out)  # after every section: partial results last
        log(f"saved {path} (section {section})" if path else f"section {section}: not saved")
    return path


def draw_figures(room: str, path: Path | None = None, log=print) -> list[Path]:
    """A room's figures from its results file (default: the committed one), as PNGs beside it."""
    import matplotlib.pyplot as plt

    plt.switch_backend("Agg")  # files only: no display
    figures, suite = part_of(room, "figures"), part_of(room, "bench").SUITE
    if path is None:
        document = results.load_measured(suite)
        path = results.RESULTS / results.device_folder(document["device"]) / f"{suite}.json"
    else:
        document = results.validate(json.loads(Path(path).read_text()), str(path))
    written = save_figures(figures, document, Path(path).parent)
    for saved in written:
        log(f"wrote {saved}")
    if hasattr(figures, "summary"):
        log(figures.summary(document))
    return written
