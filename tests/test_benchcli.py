"""The benches' shared section argument: all sections by default, unknown ones refused."""

import argparse

import pytest

from course.measure import benchcli

SECTIONS = ("timing", "quality")


def parse(argv):
    parser = argparse.ArgumentParser()
    benchcli.add_sections(parser, SECTIONS)
    return benchcli.chosen_sections(parser, parser.parse_args(argv), SECTIONS)


def test_no_section_named_means_all():
    # argparse's own `choices=` refuses exactly this call (its list default checked as one value).
    assert parse([]) == list(SECTIONS)


def test_named_sections_in_the_order_given():
    assert parse(["quality", "timing"]) == ["quality", "timing"]


def test_unknown_section_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        parse(["timing", "bogus"])
    assert "sections must be some of timing, quality; got bogus" in capsys.readouterr().err
