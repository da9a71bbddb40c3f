"""Timing refuses the simulator; results files follow the shared schema."""

import json

import pytest

import course
from course.measure import results, timing


@pytest.mark.skipif(course.on_gpu(), reason="simulator-only behaviour")
def test_bench_refuses_the_simulator():
    with pytest.raises(timing.NoTimingInSimulator, match="needs a GPU"):
        timing.bench(lambda: None)


@pytest.mark.skipif(course.on_gpu(), reason="simulator-only behaviour")
def test_graphed_timing_refuses_the_simulator():
    with pytest.raises(timing.NoTimingInSimulator, match="needs a GPU"):
        timing.bench_graphed(lambda: None)


def test_graphed_timing_checks_its_function():
    with pytest.raises(TypeError, match="fn must be callable"):
        timing.bench_graphed(3)


def test_bench_arguments_are_checked():
    with pytest.raises(TypeError, match="fn must be callable"):
        timing.bench(3)
    with pytest.raises(ValueError, match="rep_ms must be a positive number"):
        timing.bench(lambda: None, rep_ms=0)


def _document(**changes):
    document = {"suite": "ladder", "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-23T10:00:00+00:00",
                "software": {"torch": "2.11"},
                "rows": [{"name": "k1", "B": 10, "H": 10, "N": 1024, "d": 64, "median_ms": 12.5,
                          "max_abs_err": 3e-7}]}
    document.update(changes)
    return document


def test_schema_accepts_a_good_document_and_names_bad_fields():
    assert results.validate(_document())["suite"] == "ladder"
    with pytest.raises(ValueError, match="field 'rows' must be a list"):
        results.validate(_document(rows={}))
    with pytest.raises(ValueError, match=r"rows\[0\].median_ms must be a finite float"):
        results.validate(_document(rows=[{"name": "k1", "median_ms": float("nan"), "max_abs_err": 0}]))
    with pytest.raises(ValueError, match="field 'date' must be ISO-8601"):
        results.validate(_document(date="yesterday"))


def test_load_reads_committed_files_and_names_what_is_missing(tmp_path):
    (tmp_path / "h100").mkdir()
    (tmp_path / "h100" / "ladder.json").write_text(json.dumps(_document()))
    assert results.load("ladder", directory=tmp_path)["rows"][0]["name"] == "k1"
    with pytest.raises(FileNotFoundError, match="suite 'deft'"):
        results.load("deft", directory=tmp_path)


def test_device_folder_names():
    assert results.device_folder("NVIDIA H100 80GB HBM3") == "h100"
    assert results.device_folder("NVIDIA H200") == "h200"


def test_kept_rows_are_this_devices_chosen_rows_with_their_run(monkeypatch):
    from course.core import runtime

    committed = results.load("sampling", "h100")
    monkeypatch.setattr(runtime, "device_name", lambda: committed["device"])
    kept = results.kept_rows("sampling", lambda row: row.get("section") == "quality")
    wanted = [row for row in committed["rows"] if row.get("section") == "quality"]
    assert kept and len(kept) == len(wanted)
    for row, want in zip(kept, wanted, strict=True):
        assert row == dict(want, run=want.get("run", committed["date"]))
    monkeypatch.setattr(runtime, "device_name", lambda: "a device with nothing committed")
    assert results.kept_rows("sampling", lambda row: True) == []
