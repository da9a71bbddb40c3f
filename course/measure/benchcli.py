"""The benches' shared command line: which sections of a bench to measure."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_sections(parser: argparse.ArgumentParser, sections: Sequence[str]) -> None:
    """A positional `sections` argument: some of `sections`, all of them when none is named."""
    # No `choices=` here: argparse checks a list default against the choices as ONE value and
    # refuses it, so the bench would fail exactly when called without arguments.
    parser.add_argument("sections", nargs="*", metavar="section",
                        help=f"some of {', '.join(sections)} (default: all)")


def chosen_sections(parser: argparse.ArgumentParser, args: argparse.Namespace,
                    sections: Sequence[str]) -> list[str]:
    """The sections named on the command line (all by default); an unknown one is a usage error."""
    chosen = list(args.sections) or list(sections)
    unknown = [section for section in chosen if section not in sections]
    if unknown:
        parser.error(f"sections must be some of {', '.join(sections)}; got {', '.join(unknown)}")
    return chosen
