"""`python -m course bench` and `figures`: every section by default, unknown ones refused, one refusal
of the simulator, committed rows of the sections not measured now kept."""

import types

import pytest

from course import benchcli
from course.__main__ import main
from course.core import runtime
from course.measure import results

SECTIONS = ("timing", "quality")


def test_no_section_named_means_all():
    assert benchcli.chosen_sections(SECTIONS, []) == list(SECTIONS)


def test_named_sections_in_the_order_given():
    assert benchcli.chosen_sections(SECTIONS, ["quality", "timing"]) == ["quality", "timing"]


def test_unknown_section_is_a_usage_error(capsys):
    with pytest.raises(benchcli.UsageError, match="sections must be some of timing, quality; got bogus"):
        benchcli.chosen_sections(SECTIONS, ["timing", "bogus"])
    assert main(["bench", "sampling", "bogus"]) == 2
    assert "sections must be some of timing, graphs, quality; got bogus" in capsys.readouterr().err


def test_unknown_topic_is_a_usage_error(capsys):
    assert main(["figures", "tress"]) == 2
    assert "topic must be one of attention, deft," in capsys.readouterr().err


@pytest.mark.skipif(not runtime.SIMULATOR, reason="on a GPU the bench would run")
@pytest.mark.parametrize("room", list(benchcli.rooms()))
def test_every_bench_refuses_the_simulator_with_the_one_message(room, capsys):
    assert main(["bench", room]) == 2
    assert capsys.readouterr().out.strip() == benchcli.SIMULATOR_REFUSAL


def test_a_bench_keeps_the_committed_rows_of_the_sections_not_measured(monkeypatch):
    committed = {"date": "2026-01-01T00:00:00+00:00",
                 "rows": [{"name": "a", "section": "timing", "median_ms": 1.0, "max_abs_err": 0.0},
                          {"name": "b", "section": "quality", "median_ms": 2.0, "max_abs_err": 0.0}]}
    fake = types.SimpleNamespace(
        SUITE="fake", section_of=lambda row: row["section"],
        SECTIONS={"timing": lambda: [dict(committed["rows"][0], name="c")],
                  "quality": lambda: pytest.fail("quality was not asked for")})
    saved = {}
    monkeypatch.setattr(benchcli, "part_of", lambda room, part: fake)
    monkeypatch.setattr(benchcli.runtime, "SIMULATOR", False)
    monkeypatch.setattr(results, "load", lambda suite, device=None: committed)
    monkeypatch.setattr(results, "save", lambda suite, rows, directory=None: saved.setdefault(suite, rows))
    monkeypatch.setattr(benchcli.runtime, "device_name", lambda: "NVIDIA Test GPU")
    benchcli.bench("fake", ["timing"], log=lambda line: None)
    kept, measured = saved["fake"]
    assert (kept["name"], kept["run"]) == ("b", committed["date"])  # it says when it was measured
    assert measured["name"] == "c" and measured["run"] != committed["date"]


def test_a_topic_without_options_refuses_them(capsys):
    assert main(["bench", "sampling", "timing", "--pair", "small"]) == 2
    assert "the sampling bench takes no options; got --pair small" in capsys.readouterr().err


def test_a_bench_with_options_and_a_section_saved_apart(monkeypatch, tmp_path):
    """Its sections get its options and `out`; a section of SAVED_APART goes to its own file, not the
    suite's."""
    got = {}

    def add_options(parser):
        parser.add_argument("--size", type=int, default=1)

    def main_section(**options):
        got["main"] = options
        return [{"name": "m"}]

    def apart_section(**options):
        return [{"name": "a", "size": options["size"]}]

    def save_apart(rows, options):
        got["apart"] = rows, options
        return tmp_path / "apart.json"

    fake = types.SimpleNamespace(SUITE="fake", section_of=lambda row: "main", DEFAULT_SECTIONS=("main",),
                                 add_options=add_options, SAVED_APART={"apart": save_apart},
                                 SECTIONS={"main": main_section, "apart": apart_section})
    saved = {}
    monkeypatch.setattr(benchcli, "part_of", lambda room, part: fake)
    monkeypatch.setattr(benchcli.runtime, "SIMULATOR", False)
    monkeypatch.setattr(results, "kept_rows", lambda suite, keep: [])
    monkeypatch.setattr(results, "save",
                        lambda suite, rows, directory=None: saved.setdefault(suite, (rows, directory)))
    benchcli.bench("fake", [], log=lambda line: None, words=["--size", "3"], out=tmp_path)
    assert got == {"main": {"size": 3, "out": tmp_path}}  # the default section only, with the options
    rows, directory = saved.pop("fake")
    assert [row["name"] for row in rows] == ["m"] and directory == tmp_path
    path = benchcli.bench("fake", ["apart"], log=lambda line: None, words=["--size", "3"])
    assert path == tmp_path / "apart.json" and not saved  # its own file, not fake.json
    rows, options = got["apart"]
    assert [(row["name"], row["size"]) for row in rows] == [("a", 3)] and options == {"size": 3, "out": None}
    with pytest.raises(benchcli.UsageError, match="the fake bench does not take --other"):
        benchcli.bench("fake", [], words=["--other"])
