"""course.topics.kvcache.figures.emssd_figure and course.topics.sampling.figures draw a Figure and
refuse bad rows by name."""

import matplotlib

matplotlib.use("Agg")  # before pyplot: the tests never open a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from course.topics.kvcache import figures as kv_figures  # noqa: E402
from course.topics.sampling import figures as sampling_figures
from pyspec_ref import sampling as spec  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def drawn(fig) -> int:
    return sum(len(ax.lines) + len(ax.patches) for ax in fig.axes)


# ----------------------------------------------------------------------------- EMS-SD


def emssd_rows(batches=(1, 4, 16, 64)):
    rows = []
    for b in batches:
        for name, ms, kv in (("unpadded", 0.02, 1000), ("padded", 0.03, 1500)):
            rows.append({"study": "emssd", "name": name, "B": b, "median_ms": ms * b, "kv_bytes": kv * b})
    return rows


def test_emssd_figure_draws_time_speedup_and_memory():
    rows = emssd_rows() + [{"study": "swiftspec", "name": "compact", "median_ms": 1.0},  # another study
                           {"study": "emssd", "name": "padded", "B": 128, "median_ms": None,
                            "error": "out of memory"}]  # a failed measurement
    fig = kv_figures.emssd_figure(rows, note="test device")
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 3
    assert [len(ax.lines) for ax in fig.axes] == [2, 2, 2]  # padded + unpadded; speed-up + the line at 1
    xs = fig.axes[0].lines[0].get_xdata()
    assert list(xs) == [1, 4, 16, 64]
    assert np.allclose(fig.axes[1].lines[0].get_ydata(), 1.5)  # padded / unpadded time
    assert "test device" in fig._suptitle.get_text()


def test_emssd_figure_skips_batches_measured_one_way_only():
    one_way = {"study": "emssd", "name": "padded", "B": 8, "median_ms": 1.0, "kv_bytes": 1}
    rows = emssd_rows((1, 4)) + [one_way]
    fig = kv_figures.emssd_figure(rows)
    assert list(fig.axes[0].lines[0].get_xdata()) == [1, 4]


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ({"study": "emssd"}, "rows must be a list of dicts"),
        ([3], r"rows\[0\] must be a dict"),
        ([{"study": "emssd", "name": "padded", "B": 1, "median_ms": 1.0}], r"lacks \['kv_bytes'\]"),
        ([], "no batch size measured both"),
        (emssd_rows()[1::2], "no batch size measured both"),  # padded rows only
    ],
)
def test_emssd_figure_refuses_bad_rows(rows, match):
    with pytest.raises(ValueError, match=match):
        kv_figures.emssd_figure(rows)


def test_the_emssd_png_draws_with_the_shared_function():
    document = {"device": "NVIDIA Test GPU", "date": "2026-01-01T00:00:00+00:00", "rows": emssd_rows()}
    fig = kv_figures.FIGURES["emssd"](document)
    assert len(fig.axes) == 3 and drawn(fig) > 0
    assert "NVIDIA Test GPU" in fig._suptitle.get_text()


# ----------------------------------------------------------------------------- sampling: the algorithm


P = [0.05, 0.40, 0.15, 0.10, 0.20, 0.10]
Q = [0.10, 0.20, 0.10, 0.40, 0.10, 0.10]


def test_residual_figure_marks_the_specifications_token():
    fig = sampling_figures.residual_figure(P, Q, 0.7, position=1, note="token 3 over-proposed")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    token = spec.inverse_cdf(spec.residual(P, Q), 0.7)
    assert f"token {token}" in fig.axes[1].get_title()
    assert "token 3 over-proposed" in fig.axes[0].get_title()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((P, Q[:5], 0.5), "same length"),
        ((P, Q, 1.0), r"u must lie in \[0, 1\)"),
        ((P, [-0.1] + Q[1:], 0.5), "q must hold finite values >= 0"),
        ((P, P, 0.5), "residual .* is empty"),
        (([[0.5, 0.5]], [0.5, 0.5], 0.5), "p must be a non-empty 1-D"),
    ],
)
def test_residual_figure_refuses_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        sampling_figures.residual_figure(*args)


def test_tiled_draw_figure_draws_every_tile_and_the_token():
    g = torch.Generator().manual_seed(3)
    w = torch.rand(40, generator=g, dtype=torch.float64)
    fig = sampling_figures.tiled_draw_figure(w, 16, 0.62)
    ax = fig.axes[0]
    assert len(ax.patches) == 40  # one bar per token, over 3 tiles
    assert len(ax.get_legend().get_texts()) == 3
    token = spec.inverse_cdf(w.tolist(), 0.62)
    assert f"token {token}" in ax.get_title()
    with pytest.raises(ValueError, match="tile must be an int >= 1"):
        sampling_figures.tiled_draw_figure(w, 0, 0.5)
    with pytest.raises(ValueError, match="weights are all 0"):
        sampling_figures.tiled_draw_figure([0.0, 0.0], 2, 0.5)


# ----------------------------------------------------------------------------- sampling: results


def test_emitted_figure_one_panel_per_position():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.3, 0.3, 0.4]])
    emitted = torch.tensor([[0, 2], [1, spec.PAD], [1, 1], [0, 0]], dtype=torch.int32)
    fig = sampling_figures.emitted_figure(emitted, p, q, sampler="a test")
    assert len(fig.axes) == 2
    assert "4 samples" in fig.axes[0].get_title() and "3 samples" in fig.axes[1].get_title()
    assert "drawn by a test" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="p must be 2-D"):
        sampling_figures.emitted_figure(emitted, p[:1], q)
    with pytest.raises(ValueError, match="q must have shape"):
        sampling_figures.emitted_figure(emitted, p, p)
    with pytest.raises(ValueError, match="outside"):
        sampling_figures.emitted_figure(torch.tensor([[0, 3]]), p)
    with pytest.raises(ValueError, match="integer token ids"):
        sampling_figures.emitted_figure(torch.tensor([[0.0, 1.0]]), p)


def test_sigmoid_quality_figure():
    rows = [{"mismatch": s, "acceptance_exact": 1 - s / 4, "acceptance_sigmoid": 1 - s / 3,
             "tv_distance": s / 10} for s in (1.0, 0.0, 2.0)]
    fig = sampling_figures.sigmoid_quality_figure(rows)
    assert [len(ax.lines) for ax in fig.axes] == [2, 1]
    assert list(fig.axes[1].lines[0].get_xdata()) == [0.0, 1.0, 2.0]  # sorted by mismatch
    with pytest.raises(ValueError, match=r"rows\[0\] lacks \['tv_distance'\]"):
        sampling_figures.sigmoid_quality_figure([{k: v for k, v in rows[0].items() if k != "tv_distance"}])
    with pytest.raises(ValueError, match="rows is empty"):
        sampling_figures.sigmoid_quality_figure([])


def timing_rows(gamma=5, vocabulary=128256):
    return [{"name": name, "input": source, "B": b, "gamma": gamma, "V": vocabulary, "median_ms": 0.01 * b}
            for name, sources in (("baseline_torch", ("logits", "probs")), ("exact_logits", ("logits",)),
                                  ("exact_probs", ("probs",)), ("read_once_floor", ("logits", "probs")))
            for source in sources for b in (1, 8, 64)]


def test_timing_figure_one_line_per_implementation_and_input():
    fig = sampling_figures.timing_figure(timing_rows(), note="test")
    logits, probs = fig.axes
    assert len(logits.lines) == 3 and len(probs.lines) == 3
    assert "gamma = 5, V = 128256" in logits.get_title()
    with pytest.raises(ValueError, match="rows mix sizes"):
        sampling_figures.timing_figure(timing_rows() + timing_rows(gamma=1))
    with pytest.raises(ValueError, match=r"lacks \['median_ms'\]"):
        sampling_figures.timing_figure([{k: v for k, v in timing_rows()[0].items() if k != "median_ms"}])
    with pytest.raises(ValueError, match="rows must be a list of dicts"):
        sampling_figures.timing_figure({"name": "x"})
