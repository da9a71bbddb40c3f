"""The capstone bench's rows and figures, end to end on the CPU: the tiny pair, the torch reference,
a few tokens (the host's clock instead of CUDA events: the numbers mean nothing, the rows' shape and
the figures drawn from them do)."""

import datetime
import functools

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course.capstone import bench, figures, shapes  # noqa: E402
from course.capstone.weights import load_drafts, load_pair  # noqa: E402
from course.core import runtime  # noqa: E402
from course.measure import results  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    pair = load_pair("tiny", device=runtime.torch_device(), dtype=torch.float32)
    weaker = load_drafts("tiny", device=runtime.torch_device(), dtype=torch.float32)[0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench, "CHAINS", (2,))
        patch.setattr(bench, "SEQUOIA", ((6, 3),))
        patch.setattr(bench, "DYNAMIC", ((6, 2, 3, 3),))
        patch.setattr(shapes, "FIXED", (4, 2, 2, 2))
        patch.setattr(shapes, "acceptance", functools.partial(shapes.acceptance, windows=2, seq_len=32))
        return bench.Bench(pair, None, budget_s=600, max_new=6, repeats=1, log=lambda line: None,
                           backend="reference", drafts=[weaker, ("final", pair.draft)],
                           modes=(("greedy", 1.0), ("sample", 0.6))).run()


def test_every_method_batch_and_mode_is_measured(rows):
    speed = [r for r in rows if r["figure"] == "speed"]
    assert not [r for r in speed if r.get("error")]
    for batch, mode in ((1, "greedy"), (4, "greedy"), (1, "sample"), (4, "sample")):
        final = [r for r in speed if r["B"] == batch and r["mode"] == mode and r["draft"] == "final"]
        assert {r["name"] for r in final} == {"autoregressive", "chain", "tree"}, (batch, mode)
        assert {r["tree"] for r in final if r["name"] == "tree"} == set(shapes.TREES), (batch, mode)
    for draft in ("final", rows[0]["draft"]):
        sweep = [r for r in speed if r["B"] == 1 and r["mode"] == "greedy" and r["draft"] == draft]
        assert len(sweep) == (1 if draft == "final" else 0) + 1 + 1 + 1 + 1, draft
        rates = [r for r in rows if r["figure"] == "acceptance" and r["draft"] == draft]
        assert {(r["mode"], r["temperature"]) for r in rates} == {("greedy", 1.0), ("sample", 0.6)}
        assert all(0 <= x <= 1 for r in rates for x in r["rates"])
        assert all(sum(r["rates"]) <= 1 for r in rates)
    assert any(r.get("replacement") for r in speed if r["mode"] == "sample")  # SpecInfer's siblings too
    sequoia = [r for r in speed if r.get("tree") == "sequoia" and r["B"] == 1]
    assert sequoia and all(r["predicted_tokens_per_call"] >= 1 for r in sequoia)
    for r in speed:
        assert r["tokens_per_s"] > 0 and r["new_tokens"] == 6 * r["B"]
        if r["name"] == "autoregressive":
            assert r["speedup"] == 1.0 and r["tokens_per_call"] == 1.0 and r["t_plain_ms"] > 0
        else:
            assert r["identical"] if r["mode"] == "greedy" else r["max_abs_err"] == 0.0
            assert r["round_ms"] == pytest.approx(r["steps"] * r["t_draft_ms"] + r["t_verify_ms"]
                                                  + r["t_commit_ms"] + r["t_wait_ms"])
            predicted = r["tokens_per_call"] * r["t_plain_ms"] / r["round_ms"]
            assert r["predicted_speedup"] == pytest.approx(predicted)
        if r["name"] == "chain":
            assert r["width"] == r["branch"] == 1 and r["tree_size"] == r["steps"] + 1
            assert 0 <= r["alpha"] <= 1 and 1 <= r["leviathan_tokens_per_call"] <= r["steps"] + 1


def test_timeline_rows_hold_one_round_with_and_without_graphs(rows):
    lanes = [r for r in rows if r["figure"] == "timeline"]
    assert {(r["name"], r["graphs"]) for r in lanes} <= {("tree", True), ("tree", False),
                                                         ("autoregressive", True), ("autoregressive", False)}
    tree = [r for r in lanes if r["name"] == "tree"]
    assert tree  # on the CPU, the eager lanes (no graphs there)
    phases = [p[0] for p in tree[0]["phases"]]
    assert phases == ["draft"] * tree[0]["steps"] + ["verify", "commit", "wait"]
    assert tree[0]["phases"][0][1] == 0.0 and tree[0]["median_ms"] == pytest.approx(tree[0]["phases"][-1][2])


def test_figures_and_summary_draw_from_the_rows(rows, tmp_path):
    document = results.validate({"suite": bench.SUITE, "device": "the test's CPU",
                                 "date": datetime.datetime.now(datetime.UTC).isoformat(), "software": {},
                                 "rows": rows})
    for name, draw in figures.FIGURES.items():
        fig = draw(document)
        assert sum(len(ax.patches) + len(ax.collections) for ax in fig.axes) > 0, name
        fig.savefig(tmp_path / f"{name}.png")
        plt.close(fig)
    text = figures.summary(document)
    assert "x plain decoding at B = 1, greedy" in text and "formula: tau" in text


def test_every_section_of_the_capstone_bench_refuses_the_simulator(tmp_path, capsys):
    from course import benchcli
    from course.__main__ import main

    if not runtime.SIMULATOR:
        pytest.skip("on a GPU this would measure")
    for words in (["decode", "--out", str(tmp_path), "--until", "0"], ["graphs", "--out", str(tmp_path)],
                  ["step_profile", "--pair", "medium", "--modes", "greedy"],
                  ["parallel", "--smoke", "--one-gpu"]):
        assert main(["bench", "capstone", *words]) == 2, words
        assert capsys.readouterr().out.strip() == benchcli.SIMULATOR_REFUSAL, words
    assert not list(tmp_path.iterdir())


def test_the_capstone_bench_refuses_what_it_does_not_take(capsys):
    from course.__main__ import main

    assert main(["bench", "capstone", "--bogus", "3"]) == 2
    assert "the capstone bench does not take --bogus 3" in capsys.readouterr().err
    assert main(["bench", "capstone", "decodes"]) == 2
    assert "sections must be some of decode, graphs, step_profile, parallel" in capsys.readouterr().err


def test_modes_of_the_command_line():
    assert bench.modes_of("greedy,sample:0.6") == [("greedy", 1.0), ("sample", 0.6)]
    assert bench.mode_names(bench.DEFAULT_MODES) == ("greedy", "sample")
    for wrong in ("greedy:0.5", "sampling", ""):
        with pytest.raises(ValueError, match="--modes must be greedy and sample:TEMPERATURE"):
            bench.modes_of(wrong)


def test_the_sections_pass_their_options_on(monkeypatch, tmp_path):
    """What each section of `python -m course bench capstone` asks of the module that measures."""
    from course.capstone import parallel_bench, step_profile, weights

    calls = {}
    monkeypatch.setattr(parallel_bench, "measure", lambda **options: calls.setdefault("parallel", options))
    monkeypatch.setattr(step_profile, "rows",
                        lambda pair, modes: calls.setdefault("step_profile", (pair, modes)))
    defaults = dict(pair=None, max_new=None, modes=bench.DEFAULT_MODES, one_gpu=False, smoke=False, out=None)
    bench.parallel_section(**defaults)
    assert calls.pop("parallel") == dict(pair=parallel_bench.PAIR, max_new=parallel_bench.MAX_NEW,
                                         one_gpu=False, modes=("greedy", "sample"))
    bench.parallel_section(**dict(defaults, pair="small", smoke=True, one_gpu=True, modes="greedy"))
    assert calls.pop("parallel") == dict(pair="small", max_new=16, one_gpu=True, modes=("greedy",),
                                         n_prompts=1, steps=(2,), repeats=1)
    assert bench._save_parallel([], dict(defaults, smoke=True)) is None  # a quick pass: nothing saved
    bench.step_profile_section(**dict(defaults, modes="greedy,sample:0.6,sample:1.0"))
    assert calls.pop("step_profile") == (bench.PAIR, ("greedy", "sample"))

    built = {}

    class FakeBench:
        def __init__(self, pair, out, budget, max_new, repeats, drafts, modes):
            built.update(pair=pair, out=out, budget=budget, max_new=max_new, drafts=drafts, modes=modes)

        def run(self):
            return []

    loaded = weights.Pair("target", "draft", "small")
    monkeypatch.setattr(bench, "Bench", FakeBench)
    monkeypatch.setattr(weights, "load_pair", lambda name, dtype: loaded)
    monkeypatch.setattr(bench.runtime, "device_name", lambda: "NVIDIA H200")
    now = bench.time.time()
    bench.decode_section(**dict(defaults, pair="small", until=now + 100, final_draft_only=True, out=tmp_path,
                                modes="sample:0.6", budget=bench.BUDGET_S, repeats=1))
    assert built["out"] == tmp_path and built["drafts"] == [("final", "draft")]
    assert built["modes"] == [("sample", 0.6)]
    assert 70 < built["budget"] <= 80 and built["max_new"] == bench.MAX_NEW  # the deadline less 20 s
    bench.decode_section(**dict(defaults, pair="small", final_draft_only=True, budget=5.0, repeats=1))
    assert built["out"].parts[-2:] == ("results", "h200") and built["budget"] == 5.0
    with pytest.raises(ValueError, match="the decode section's is the graphs section"):
        bench.decode_section(**dict(defaults, smoke=True))


def test_the_graphs_check_reports_every_case_then_fails(monkeypatch):
    from course.capstone import graphs_check, weights

    monkeypatch.setattr(weights, "load_pair", lambda name, dtype: None)
    failing = {("tree", "sample")}

    def case(pair, encoded, kind, mode, tree, plain_tokens):
        if (kind, mode) in failing:
            raise RuntimeError("capture failed")
        return dict(name=kind, mode=mode, B=2, median_ms=1.0, max_abs_err=0.0, graphed_equals_eager=True,
                    equals_plain_greedy=True, passed=True, eager_s=0.1, build_s=0.1, eager_tokens_per_s=1.0,
                    graphed_tokens_per_s=2.0, tokens_per_call=1.0, tokens=[[1], [2]])

    monkeypatch.setattr(graphs_check, "_case", case)
    lines = []
    with pytest.raises(ValueError, match="the graphed decoders failed their check: tree sample"):
        graphs_check.rows("small", log=lines.append)
    assert len(lines) == len(graphs_check.CASES) + 1 and "FAILED RuntimeError: capture failed" in lines[3]
    failing.clear()
    rows = graphs_check.rows("small", log=lines.append)
    assert len(rows) == len(graphs_check.CASES) and all(r["passed"] and "tokens" not in r for r in rows)


def test_the_step_profile_compares_the_modes_it_profiled():
    from course.capstone.step_profile import comparisons

    sampled = {f"{shape} sample{fused}": {} for shape in ("chain", "tree") for fused in ("", " fused")}
    assert comparisons(sampled, ("sample",)) == [("chain sample", "tree sample", "sample"),
                                                 ("chain sample fused", "tree sample fused", "sample fused")]
    both = {f"{shape} {mode}": {} for shape in ("chain", "tree") for mode in ("greedy", "sample")}
    assert [label for *_, label in comparisons(both, ("greedy", "sample"))] == ["greedy", "sample"]
