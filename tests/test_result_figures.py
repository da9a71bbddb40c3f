"""Each room's figures draw from its committed measurements, with a line or bar for every method
measured, labelled with the device they were measured on."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course import benchcli  # noqa: E402
from course.measure import results  # noqa: E402

FIGURES = [(room, name) for room in benchcli.rooms() for name in benchcli.part_of(room, "figures").FIGURES]


@pytest.mark.parametrize(("room", "name"), FIGURES)
def test_each_committed_figure_draws(room, name):
    suite = benchcli.part_of(room, "bench").SUITE
    try:
        document = results.load_measured(suite)
    except results.NotMeasuredYet:
        pytest.skip(f"no committed {suite}.json")
    fig = benchcli.part_of(room, "figures").FIGURES[name](document)
    drawn = sum(len(ax.lines) + len(ax.patches) + len(ax.collections) for ax in fig.axes)
    titles = [ax.get_title(loc) for ax in fig.axes for loc in ("left", "center")]
    titles.append(fig._suptitle.get_text() if fig._suptitle else "")
    assert drawn > 0
    assert any(document["device"] in title for title in titles)  # never mistaken for another machine
    plt.close(fig)


def test_figures_writes_the_pngs_beside_the_results(tmp_path, monkeypatch):
    document = results.load_measured("triton_attention")
    path = tmp_path / "h100" / "triton_attention.json"
    path.parent.mkdir()
    path.write_text(results.json.dumps(document))
    written = benchcli.draw_figures("triton_attention", path, log=lambda line: None)
    assert [p.name for p in written] == ["triton_attention.png"] and written[0].stat().st_size > 1000
