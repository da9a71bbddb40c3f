"""The committed measurements' figures draw, with a line or bar for every method measured."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course import result_figures  # noqa: E402
from course.measure import results


@pytest.mark.parametrize("suite", sorted(result_figures.FIGURES))
def test_each_committed_suite_draws(suite):
    draw, _ = result_figures.FIGURES[suite]
    try:
        document = results.load_measured(suite)
    except results.NotMeasuredYet:
        pytest.skip(f"no committed {suite}.json")
    fig = draw(document["rows"], document["device"])
    drawn = sum(len(ax.lines) + len(ax.patches) for ax in fig.axes)
    titles = [ax.get_title(loc) for ax in fig.axes for loc in ("left", "center")]
    titles.append(fig._suptitle.get_text() if fig._suptitle else "")
    assert drawn > 0
    assert any(document["device"] in title for title in titles)  # never mistaken for another machine
    plt.close(fig)
