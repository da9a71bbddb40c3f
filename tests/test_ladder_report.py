"""course.topics.ladder.figures: targets and figures from a ladder document; missing data is named."""

import copy
import json

import matplotlib

matplotlib.use("Agg")  # before pyplot: the tests never open a window

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import course  # noqa: E402, F401  (picks GPU or simulator first)
from course.__main__ import main
from course.core import runtime
from course.measure import plots, results
from course.topics.ladder import bench as ladder_bench
from course.topics.ladder import figures as ladder_figures
from course.topics.ladder import rungs as ladder  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


B, H, N, D = ladder_bench.PAPER_SHAPE


def _row(name, figure, ms, batch=B, n=N, order="bfs", heads=H, **extra):
    return {"name": name, "figure": figure, "B": batch, "H": heads, "N": n, "d": D, "order": order,
            "median_ms": float(ms), "max_abs_err": 1e-6, **extra}


def synthetic(fast=True) -> dict:
    """A small document: `fast` meets every target, otherwise none is met."""
    paper = ladder_figures.paper_rungs()
    k1 = 100.0
    k8 = 1.0 if fast else 10.0  # 100x vs 10x
    sdpa, flex = 0.9, 0.8  # k8 within 1.5x of SDPA only when fast
    best = 0.3 if fast else 0.85  # beyond-paper: <= half of SDPA and < flex only when fast
    rows = []
    for i, name in enumerate(paper):  # geometric from k1 to k8
        ms = k1 * (k8 / k1) ** (i / (len(paper) - 1))
        rows.append(_row(name, "ladder", ms, shared_bytes=28672 + 128 * i, registers=60 + 10 * i, threads=32))
    rows.append(_row(ladder_figures.DENSE, "ladder", k8 * 1.2, shared_bytes=29696, registers=168, threads=32))
    beyond = ladder_figures.beyond_rungs()[0]
    rows.append(_row(beyond, "ladder", best, shared_bytes=29952, registers=185, threads=32))
    rows.append(_row(beyond, "ladder", best * 1.1, order="dfs"))
    rows += [_row("sdpa_dense_fp32", "ladder", sdpa), _row("flex_fp32", "ladder", flex)]
    for n in (256, 512):
        rows += [_row("k8", "dense", n / 256, n=n), _row("k8_dense", "dense", 1.2 * n / 256, n=n)]
    small_k8 = 0.01 if fast else 0.1
    for batch, n in ((10, 256), (10, 1024), (1, 1024), (1, 64), (1, 256)):
        rows += [_row("k8", "pytorch", small_k8 * n / 64, batch, n),
                 _row(beyond, "pytorch", small_k8 * n / 128, batch, n),
                 _row(beyond, "pytorch", small_k8 * n / 120, batch, n, order="dfs"),
                 _row("sdpa_dense_fp32", "pytorch", 0.05 * n / 64, batch, n),
                 _row("flex_fp32", "pytorch", 0.04 * n / 64, batch, n)]
    memory = {"dense_mask_bytes": 2 * (1 << 18) ** 2, "dense_mask_allocated": False, "gpu_bytes": 80 << 30}
    rows += [_row(beyond, "memory", 140.0, 2, 1 << 18, order="dfs", heads=1, **memory),
             _row("k8", "memory", 3800.0, 2, 1 << 18, heads=1, **memory)]
    return {"suite": "ladder", "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-23T10:00:00+00:00",
            "software": {"torch": "2.11"}, "rows": rows}


def test_rung_lists_come_from_the_ladder_table():
    names = [rung.name for rung in ladder.RUNGS]
    assert ladder_figures.paper_rungs() == names[:names.index("k8") + 1]
    assert ladder_figures.paper_rungs()[0] == "k1" and "k8_dense" not in ladder_figures.paper_rungs()
    beyond = ladder_figures.beyond_rungs()
    assert "k9" in beyond and "k8_dense" not in beyond and "k8" not in beyond
    assert set(ladder_bench.BASELINES) == {ladder_figures.SDPA, ladder_figures.FLEX}


def test_targets_met_on_a_fast_document():
    found = ladder_figures.targets(synthetic(fast=True))
    assert len(found) == 4
    assert all(target["met"] for target in found), [t["measured"] for t in found]
    assert all(isinstance(target["target"], str) and target["measured"] for target in found)
    assert found[0]["values"]["speedup"] == pytest.approx(100.0)
    assert found[2]["values"]["best"] == ladder_figures.beyond_rungs()[0]


def test_targets_not_met_on_a_slow_document():
    found = ladder_figures.targets(synthetic(fast=False))
    assert [target["met"] for target in found] == [False, False, False, False]
    assert found[0]["values"]["speedup"] == pytest.approx(10.0)
    assert found[1]["values"]["ratio"] == pytest.approx(10.0 / 0.9)


def test_one_target_flips_at_its_threshold():
    document = synthetic(fast=True)
    k1 = next(row for row in document["rows"] if row["name"] == "k1" and row["figure"] == "ladder")
    k1["median_ms"] = ladder_figures.SPEEDUP_TARGET * 1.0 * 0.99  # k8 is 1 ms: just under 30x
    assert [target["met"] for target in ladder_figures.targets(document)] == [False, True, True, True]


def test_steps_multiply_to_the_end_to_end_factor():
    document = synthetic()
    steps = {s["name"]: s for s in ladder_figures.steps(document)}
    paper = ladder_figures.paper_rungs()
    product = 1.0
    for name in paper[1:]:
        assert steps[name]["previous"] == ladder.BY_MODULE[ladder.BY_NAME[name].previous].name
        product *= steps[name]["speedup"]
    assert product == pytest.approx(100.0)


def test_tables():
    document = synthetic()
    labels = [row["label"] for row in ladder_figures.ladder_rows(document)]
    beyond = ladder_figures.beyond_rungs()[0]
    assert labels[0] == "k1" and f"{beyond} (DFS)" in labels
    assert labels[-2:] == ["sdpa_dense_fp32", "flex_fp32"]
    dense = ladder_figures.dense_rows(document)
    assert [row["N"] for row in dense] == [256, 512]
    assert all(row["dense_over_interval"] == pytest.approx(1.2) for row in dense)
    assert set(ladder_figures.series(document, "B1")) == {"k8", beyond, f"{beyond} (DFS)", "sdpa_dense_fp32",
                                                         "flex_fp32"}
    assert [x for x, _ in ladder_figures.series(document, "B1")["k8"]] == [64, 256, 1024]
    table = ladder_figures.memory_table(document)
    assert table[-1]["dense_allocated"] is False and table[0]["dense_allocated"] is True
    assert table[-1]["interval_bytes"] == 2 * 2 * (1 << 18) * 4
    assert table[0]["dense_mask_bytes"] == 10 * 256 * 256


def test_format_bytes():
    assert plots.format_bytes(12) == "12 B"
    assert plots.format_bytes(1536) == "1.5 KiB"
    assert plots.format_bytes(1 << 37) == "128.0 GiB"
    with pytest.raises(ValueError, match="count must be"):
        plots.format_bytes(-1)


def test_figures_build():
    document = synthetic()
    assert ladder_figures.fig3(document).get_title(loc="left").startswith("the ladder")
    for draw in (ladder_figures.fig5, ladder_figures.fig67, ladder_figures.fig8):
        assert isinstance(draw(document), plt.Figure)


def test_save_figures_writes_the_pngs(tmp_path):
    paths = plots.save_figures(ladder_figures, synthetic(), tmp_path)
    assert sorted(p.name for p in paths) == sorted(f"{name}.png" for name in ladder_figures.FIGURES)
    assert all(p.stat().st_size > 1000 for p in paths)


def _without(document, keep):
    document = copy.deepcopy(document)
    document["rows"] = [row for row in document["rows"] if keep(row)]
    return document


@pytest.mark.parametrize(("drop", "call", "message"), [
    (lambda r: r["name"] == "k3" and r["figure"] == "ladder", ladder_figures.fig3, "'ladder' row for 'k3'"),
    (lambda r: r["name"] == "flex_fp32" and r["figure"] == "ladder", ladder_figures.targets,
     "'ladder' row for 'flex_fp32'"),
    (lambda r: r["name"] in ladder_figures.beyond_rungs(), ladder_figures.targets, "beyond the paper"),
    (lambda r: r["figure"] == "pytorch" and r["B"] == 1, ladder_figures.targets, "B=1"),
    (lambda r: r["figure"] == "dense", ladder_figures.fig5, "no 'dense' rows"),
    (lambda r: r["name"] == "k8_dense" and r["figure"] == "dense", ladder_figures.fig5, "'k8_dense'"),
    (lambda r: r["figure"] == "memory", ladder_figures.memory_table, "no 'memory' rows"),
    (lambda r: r["figure"] == "pytorch", ladder_figures.fig67, "no 'pytorch' rows"),
])
def test_missing_rows_are_named(drop, call, message):
    with pytest.raises(ValueError, match=message):
        call(_without(synthetic(), lambda row: not drop(row)))


def test_missing_fields_are_named():
    document = synthetic()
    del document["rows"][0]["order"]
    with pytest.raises(ValueError, match=r"rows\[0\] \('k1'\) has no 'order'"):
        ladder_figures.targets(document)
    document = synthetic()
    k2 = next(row for row in document["rows"] if row["name"] == "k2")
    del k2["shared_bytes"]
    with pytest.raises(ValueError, match="'k2' has no 'shared_bytes'"):
        ladder_figures.fig8(document)
    document = synthetic()
    del document["rows"][-1]["gpu_bytes"]
    with pytest.raises(ValueError, match="has no 'gpu_bytes'"):
        ladder_figures.memory_table(document)
    with pytest.raises(ValueError, match="field 'rows' must be a list"):
        ladder_figures.targets({k: v for k, v in synthetic().items() if k != "rows"})
    with pytest.raises(ValueError, match="panel must be one of"):
        ladder_figures.series(synthetic(), "H")


def test_the_committed_measurements():
    document = results.load("ladder")
    found = ladder_figures.targets(document)
    assert len(found) == 4 and all(isinstance(target["met"], bool) for target in found)
    assert ladder_figures.ladder_rows(document)[0]["name"] == "k1"
    table = ladder_figures.memory_table(document)
    assert any(not row["dense_allocated"] for row in table)  # the tree too large for a dense mask
    for draw in (ladder_figures.fig3, ladder_figures.fig5, ladder_figures.fig67, ladder_figures.fig8):
        draw(document)


def test_the_cli_saves_next_to_the_json(tmp_path, capsys):
    path = tmp_path / "h100" / "ladder.json"
    path.parent.mkdir()
    path.write_text(json.dumps(synthetic()))
    assert main(["figures", "ladder", "--results", str(path)]) == 0
    pngs = sorted(p.name for p in path.parent.glob("*.png"))
    assert pngs == sorted(f"{name}.png" for name in ladder_figures.FIGURES)
    assert "met" in capsys.readouterr().out


@pytest.mark.skipif(course.on_gpu(), reason="simulator-only behaviour")
def test_measurements_in_the_simulator_are_the_committed_ones():
    document, where = ladder_bench.measurements()
    assert where.startswith("simulator") and document["device"] in where
    assert document == results.load("ladder")
    only, _ = ladder_bench.measurements(["memory"])
    assert {row["figure"] for row in only["rows"]} == {"memory"}
    with pytest.raises(ValueError, match="sections must be some of"):
        ladder_bench.measurements(["plots"])


def test_runtimes_if_measured_says_which_rows_are_missing(monkeypatch, capsys):
    if runtime.on_gpu():
        pytest.skip("on a GPU runtimes() measures")
    document = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-01-01T00:00:00+00:00",
                "rows": [{"name": "k8", "figure": "ladder", "order": "bfs", "median_ms": 3.0,
                          "max_abs_err": 1e-6}]}
    monkeypatch.setattr(results, "load", lambda suite, *args, **kwargs: document)
    assert [row["median_ms"] for row in ladder_bench.runtimes_if_measured(["k8"])] == [3.0]
    assert ladder_bench.runtimes_if_measured(["k8"], "dfs") == []
    printed = capsys.readouterr().out
    assert "not measured yet" in printed and "no 'k8' row in dfs order" in printed
    with pytest.raises(ValueError, match="names must be rungs"):
        ladder_bench.runtimes_if_measured(["k99"])
