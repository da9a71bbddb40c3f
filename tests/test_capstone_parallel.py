"""Parallel tree generation with the tiny pair on the CPU (notebook 20): both workers in one
process and in two processes through gloo, greedy equal to plain decoding, sampling following the
target's distribution, the draft's KV cache matching its tree, the wire's checks, a mismatched
pair refused, and a dead, frozen or silent process stopping its peer within seconds."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch

import course  # noqa: F401  (first: chooses the simulator / interpreter)
from course.capstone import decoder, parallel, processes, weights, wire
from course.capstone.model import TinyLM
from course.capstone.sides import GROWTHS, DraftSide, TargetSide
from course.capstone.text import encode
from course.core import runtime
from course.measure.stats import chi_square_p_value

PROMPT = encode("The old fox ")
TINY = {role: str(weights.weight_path("tiny", role)) for role in wire.ROLES}
DEVICE = "cuda:0" if runtime.on_gpu() else "cpu"  # both processes of a test job


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)  # tiny models: threads only contend
    return weights.load_pair("tiny", device=runtime.torch_device(), dtype=torch.float32)


@pytest.fixture(scope="module")
def plain(pair):
    return decoder.autoregressive(pair.target, [PROMPT], 24, backend="reference").tokens[0]


@pytest.mark.parametrize("schedule, growth",
                         [("serial", "best"), ("parallel", "best"), ("parallel", "likely"),
                          ("queued", "likely")])
@pytest.mark.parametrize("tree_size, width, steps", [(4, 2, 0), (4, 2, 2), (6, 3, 1), (3, 1, 4)])
def test_greedy_equals_plain_decoding(pair, plain, schedule, growth, tree_size, width, steps):
    got = parallel.generate(pair.target, pair.draft, PROMPT, 24, tree_size=tree_size, width=width,
                            steps=steps, schedule=schedule, growth=growth, backend="reference")
    assert got.tokens == plain
    if schedule == "queued" and not steps:  # no growth ahead: after the first tree, every root sent alone
        assert not any(got.reused)
        return
    assert got.target_calls < 24 and got.tokens_per_call > 1.5  # the draft does get tokens accepted
    if schedule != "serial" and steps >= 2:
        # subtrees grown during verification survive re-rooting (the first step ahead runs the leaves
        # just sent; a node below them, which a new root must be, needs a second)
        assert any(got.reused)


def test_the_queued_schedule_needs_the_device_tree(pair):
    with pytest.raises(ValueError, match="queued schedule needs the draft's tree on the device"):
        parallel.generate(pair.target, pair.draft, PROMPT, 4, tree_size=4, width=2, steps=1,
                          schedule="queued", backend="reference", draft_tree="host")


def test_greedy_with_the_kernels(pair, plain):
    got = parallel.generate(pair.target, pair.draft, PROMPT, 5, tree_size=4, width=2, steps=2,
                            impl="solutions")
    assert got.tokens == plain[:5]


def test_built_sides_serve_many_generations(pair):
    """Sides built once (as the bench and the workers build them; on a GPU that is when their CUDA
    graphs are captured) give every generation what fresh sides give: caches, trees and random
    generators start again, and a shorter prompt fits a side built for a longer one."""
    same = dict(tree_size=4, width=2, steps=2, branch=2, mode="sample", backend="reference")
    sides = parallel.build_sides(pair.target, pair.draft, max_prompt=len(PROMPT), max_new_tokens=12, **same)
    for prompt, seed in ((PROMPT, 3), (PROMPT[:5], 5), (PROMPT, 3)):
        again = parallel.run_sides(sides, prompt, seed=seed)
        fresh = parallel.generate(pair.target, pair.draft, prompt, 12, seed=seed, **same)
        assert (again.tokens, again.accepted, again.reused) == (fresh.tokens, fresh.accepted, fresh.reused)
    with pytest.raises(ValueError, match="a prompt of 13 tokens"):
        parallel.run_sides(sides, PROMPT + [1])


def test_a_pass_that_does_not_fit_its_step_is_refused(pair):
    cfg = decoder.settings(4, 2, 2)
    side = DraftSide(pair.draft, cfg, 1, max_prompt=8, max_new_tokens=4, backend="reference")
    step = side.passes[2]
    with pytest.raises(ValueError, match="3 queries .* does not fit this step .2 queries"):
        step.load(0, ([0, 1, 2], [2, 2, 2]), [0, 1, 2], [5, 6, 7], [0, 1, 2])


def test_sampling_matches_target_distribution(pair):
    """Many seeded runs of the parallel schedule: each of the first three emitted tokens follows the
    target's marginal distribution, as in the capstone's own test (SpecInfer §4.3); the later ones
    often come from a round whose tree reused a subtree grown during verification."""
    prompt, runs, n = encode("The old "), 300, 3
    emitted, accepted, reused = [], 0, 0
    for seed in range(runs):
        got = parallel.generate(pair.target, pair.draft, prompt, n, tree_size=3, width=1, steps=6, branch=2,
                                mode="sample", seed=7 * seed, backend="reference")
        emitted.append(got.tokens)
        accepted += sum(got.accepted)
        reused += sum(got.reused)
    assert accepted > 0.5 * runs and reused > 0.1 * runs  # the tree walk and the reuse are exercised
    vocab = pair.target.config.vocab_size
    marginals, joint, seqs = [], torch.ones(1, dtype=torch.float64), [prompt]
    with torch.no_grad():
        for _ in range(n):  # p(x_i) by enumerating every earlier token (80 * 80 sequences at most)
            logits = pair.target(torch.tensor(seqs, device=pair.target.device))[:, -1]
            probs = torch.softmax(logits.double(), -1).cpu()  # (len(seqs), V)
            step = joint[:, None] * probs
            marginals.append(step.sum(0))
            joint, seqs = step.reshape(-1), [s + [x] for s in seqs for x in range(vocab)]
    for i in range(n):
        counts = torch.bincount(torch.tensor([t[i] for t in emitted]), minlength=vocab)
        assert chi_square_p_value(counts, marginals[i], pool_below=5) > 1e-3, f"token {i + 1}"
    counts = torch.bincount(torch.tensor([t[1] for t in emitted]), minlength=vocab)
    assert chi_square_p_value(counts, marginals[0], pool_below=5) < 1e-3  # the test has power


def test_a_draft_tree_larger_than_its_cache_is_refused(pair):
    side = DraftSide(pair.draft, decoder.settings(4, 2, 2), 1, max_prompt=8, max_new_tokens=4,
                     backend="reference")
    side.start(PROMPT[:8])
    side.grow(1)
    while side.prefix + len(side.tree) <= side.rows:  # more nodes than grow ever makes
        side.tree._add(0, 1, -1.0, -1.0)
    before = side.cache.data.clone()
    with pytest.raises(ValueError, match=r"more than the \d+ rows of its KV cache"):
        side._run([len(side.tree) - 1])
    assert torch.equal(side.cache.data, before)


def test_the_draft_draws_siblings_without_replacement(pair):
    """Sampling: a run node's candidates are distinct tokens (Gumbel top-k, Sequoia's siblings), as
    nodes and as queued candidates alike (the target verifies them as draws without replacement:
    `test_sampling_matches_target_distribution`)."""
    cfg = decoder.settings(6, 2, 4, mode="sample")
    side = DraftSide(pair.draft, cfg, 2, max_prompt=len(PROMPT), max_new_tokens=8, backend="reference")
    side.start(PROMPT, seed=3)
    side.grow(2)
    tree = side.tree
    siblings: dict = {}
    for v in range(1, len(tree)):
        siblings.setdefault(tree.parents[v], []).append(tree.tokens[v])
    for _, _, parent, token, _ in tree.heap:
        siblings.setdefault(parent, []).append(token)
    assert sum(tree.run) >= 3 and all(len(set(t)) == len(t) == cfg.branch for t in siblings.values())


def _kv_of(model, sequence: list[int]) -> torch.Tensor:
    """The KV rows (R, len, d) of a fresh causal prefill of `sequence` (its last token included)."""
    cache = model.new_cache(1, len(sequence) + 1)
    decoder.prefill(decoder.make_backend("reference"), model, cache, [sequence + [0]])
    return cache.data[0, :, :len(sequence)]


@pytest.mark.parametrize("ahead, growth", [(2, "best"), (2, "likely"), (0, "best")])
def test_the_draft_cache_matches_its_tree_after_every_reroot(pair, ahead, growth):
    """SwiftSpec §3.2's invariant on the real cache: after each re-root, row i < P holds the KV of
    committed token i and row P + v the KV of tree node v's path, for every node the draft ran.
    ahead: draft steps while the target verifies; with none, paths end at leaves never run, whose
    KV the re-root computes (with the new root's, in one pass)."""
    cfg = decoder.settings(4, 2, 3, mode="greedy")
    sizes = dict(max_prompt=len(PROMPT), max_new_tokens=16, backend="reference")
    d_side = DraftSide(pair.draft, cfg, 2, growth=growth, **sizes)
    t_side = TargetSide(pair.target, cfg, **sizes)
    d_side.start(PROMPT)
    t_side.start(PROMPT)
    d_side.grow(0)
    committed, kept, adopted = list(PROMPT[:-1]), 0, 0
    for _ in range(5):
        parents, tokens, q = d_side.subtree()
        d_side.grow(ahead, ahead=True)  # while the target verifies
        path, nxt = t_side.verify(parents, tokens, q)
        committed += [tokens[j] for j in path]
        calls = d_side.calls
        kept += d_side.reroot(path, nxt) is not None
        adopted += d_side.calls > calls
        tree, P = d_side.tree, d_side.prefix
        assert P == len(committed) == t_side.prefix
        cache = d_side.cache.data[0]
        torch.testing.assert_close(cache[:, :P], _kv_of(pair.draft, committed), atol=1e-5, rtol=1e-4)
        for v in range(len(tree)):
            if tree.run[v]:
                up, u = [], v
                while u >= 0:
                    up.append(tree.tokens[u])
                    u = tree.parents[u]
                want = _kv_of(pair.draft, committed + up[::-1])[:, -1]
                torch.testing.assert_close(cache[:, P + v], want, atol=1e-5, rtol=1e-4)
        d_side.grow(0)
    if ahead:
        assert kept >= 2  # grown-ahead subtrees were kept, so their moved rows were checked
    else:
        assert adopted >= 2  # accepted leaves were run at the re-root, and their rows checked


def test_the_target_refuses_a_subtree_that_was_not_rerooted(pair):
    cfg = decoder.settings(4, 2, 3, mode="greedy")
    side = TargetSide(pair.target, cfg, max_prompt=len(PROMPT), max_new_tokens=8, backend="reference")
    side.start(PROMPT)
    with pytest.raises(ValueError, match="did not re-root"):
        side.verify([-1, 0], [PROMPT[-1] + 1, 3])
    with pytest.raises(ValueError, match="not a tree rooted at 0"):
        side.verify([-1, 2, 0], [PROMPT[-1], 3, 4])
    with pytest.raises(ValueError, match="1 to 4 nodes"):
        side.verify([-1, 0, 0, 0, 0], [PROMPT[-1]] * 5)


# --------------------------------------------------------------------------- the wire


def test_messages_round_trip_and_bad_ones_are_named():
    sub = wire.Subtree(3, [-1, 0, 0, 1], [5, 6, 7, 8])
    got = wire.decode(wire.encode(sub, 6).tolist(), 6, 80, "draft")
    assert (got.kind, got.round, got.parents, got.tokens) == (wire.SUBTREE, 3, sub.parents, sub.tokens)
    reply = wire.Reply(wire.ACCEPTED, 3, [0, 1, 3], 42)
    assert wire.decode(wire.encode(reply, 6).tolist(), 6, 80, "target", last_subtree=sub) == reply
    stop = wire.Reply(wire.STOP, 3, [0], 7)
    assert wire.decode(wire.encode(stop, 6).tolist(), 6, 80, "target", last_subtree=sub) == stop

    def corrupt(message, index, value, **kw):
        values = wire.encode(message, 6).tolist()
        values[index] = value
        return wire.decode(values, 6, 80, "target" if isinstance(message, wire.Reply) else "draft", **kw)

    for args, match in (((sub, 0, 1234), "magic number"), ((sub, 1, 9), "unknown kind"),
                        ((sub, 3, 7), "counts 7 nodes"), ((sub, wire.HEADER + 2, 3), "not a tree rooted"),
                        ((sub, wire.HEADER + 6, 80), r"not all in \[0, 80\)"),
                        ((reply, 4, 99), "next token 99"), ((reply, wire.HEADER + 2, 2), "not a root path")):
        with pytest.raises(wire.WireError, match=match):
            corrupt(*args, last_subtree=sub)
    with pytest.raises(wire.WireError, match="answered round 4"):
        corrupt(reply, 2, 4, last_subtree=sub)
    with pytest.raises(wire.WireError, match="does not fit"):
        wire.encode(wire.Subtree(0, [-1] * 7, [1] * 7), 6)


def test_the_handshake_names_every_difference():
    shared = dict(tree_size=8, width=2, branch=4, max_new_tokens=16, eos=None, runs_crc=11)
    target = wire.hello("target", 80, torch.float32, **shared).tolist()
    wire.check_hello(target, wire.hello("draft", 80, torch.float32, **shared).tolist())
    draft = wire.hello("draft", 81, torch.float16, **dict(shared, width=4)).tolist()
    with pytest.raises(wire.PairMismatch) as error:
        wire.check_hello(target, draft)
    assert "vocab_size: target 80, draft 81" in str(error.value)
    for difference in ("dtype: target float32, draft float16", "width: target 2, draft 4"):
        assert difference in str(error.value)
    with pytest.raises(wire.PairMismatch, match="both processes claim the role 'target'"):
        wire.check_hello(target, target)
    with pytest.raises(wire.PairMismatch, match="another protocol"):
        wire.check_hello(target, [0] * len(target))


# --------------------------------------------------------------------------- two processes


def _job(**changes) -> processes.Job:
    options = dict(tree_size=4, width=2, max_new_tokens=8, backend="reference", peer_timeout=2.0,
                   devices={"target": DEVICE, "draft": DEVICE})
    runs = changes.pop("runs", [processes.Run(PROMPT, 2)])
    return processes.Job(TINY["target"], TINY["draft"], runs, **(options | changes))


@pytest.mark.parametrize("transport, backend", [("gloo", "kernels"), ("shm", "reference")])
def test_two_processes_produce_the_lockstep_tokens(pair, plain, transport, backend):
    """Both processes on this device, the messages through gloo (with the course's kernels: the
    simulator and the interpreter in both processes) or through shared memory (`wire.Mailbox`): a
    greedy run and a sampled one each equal the one-process run of the same settings."""
    runs = [processes.Run(PROMPT, 2, "greedy", 0), processes.Run(PROMPT, 1, "sample", 5)]
    job = _job(runs=runs, max_new_tokens=6, backend=backend, impl="solutions", transport=transport)
    got = processes.launch(job, timeout=300)
    assert got[0].tokens == plain[:6]
    for run, generation in zip(runs, got, strict=True):
        same = parallel.generate(pair.target, pair.draft, PROMPT, 6, tree_size=4, width=2, steps=run.steps,
                                 branch=4, mode=run.mode, seed=run.seed, backend=backend, impl="solutions")
        assert (generation.tokens, generation.accepted, generation.reused) == (same.tokens, same.accepted,
                                                                                same.reused)
        assert generation.processes == 2 and generation.target_calls == len(generation.accepted)
        sides = {e["side"] for e in generation.events}
        assert sides == {"draft", "target"}  # both timelines came back


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_through_nccl(pair, plain):
    """On a machine with two GPUs: the target on cuda:0, the draft on cuda:1, NCCL between them."""
    runs = [processes.Run(PROMPT, 2, "greedy", 0), processes.Run(PROMPT, 3, "sample", 5)]
    job = _job(runs=runs, max_new_tokens=16, backend="kernels", impl="solutions", transport="nccl",
               devices={"target": "cuda:0", "draft": "cuda:1"})
    got = processes.launch(job, timeout=300)
    assert got[0].tokens == plain[:16]
    same = parallel.generate(pair.target, pair.draft, PROMPT, 16, tree_size=4, width=2, steps=3, branch=4,
                             mode="sample", seed=5, impl="solutions")
    assert (got[1].tokens, got[1].accepted) == (same.tokens, same.accepted)


def test_a_mismatched_pair_is_refused_before_anything_runs(tmp_path):
    other = TinyLM(weights.CONFIGS["tiny"]["draft"].__class__(**{**weights.CONFIGS["tiny"]["draft"].to_dict(),
                                                                   "vocab_size": 81}))
    path = tmp_path / "draft81.safetensors"
    weights.save_model(other, path, torch.float32)
    job = _job()
    job.draft = str(path)
    with pytest.raises(wire.PairMismatch, match="vocab_size: target 80, draft 81"):
        processes.Launch(job)  # refused by the launcher: no process started
    # launched anyway (as two separately started workers would be), the handshake refuses it too
    job = _job(dtypes={"target": "float32", "draft": "float16"})
    with pytest.raises(processes.ParallelError, match="dtype: target float32, draft float16") as error:
        processes.Launch(job, check=False).wait(60)
    assert "neither was loaded onto a GPU" in str(error.value)


def _stopped_within(launch: processes.Launch, role: str, seconds: float) -> float:
    start = time.monotonic()
    while launch.processes[role].poll() is None:
        assert time.monotonic() - start < seconds, f"the {role} process did not stop within {seconds} s"
        time.sleep(0.05)
    return time.monotonic() - start


def _paused(launch: processes.Launch, role: str) -> None:
    start = time.monotonic()
    while not launch.paused(role):
        assert time.monotonic() - start < 120, "the job did not reach its pause point"
        assert all(p.poll() is None for p in launch.processes.values()), "a process ended early"
        time.sleep(0.05)


@pytest.mark.parametrize("victim, how, transport", [("draft", "kill", "gloo"), ("target", "kill", "gloo"),
                                                     ("draft", "freeze", "gloo"), ("draft", "kill", "shm"),
                                                     ("target", "freeze", "shm")])
def test_a_dead_or_frozen_process_stops_its_peer_within_seconds(victim, how, transport):
    peer = "target" if victim == "draft" else "draft"
    launch = processes.Launch(_job(max_new_tokens=60, pause=[victim, 1], transport=transport))
    _paused(launch, victim)
    os.kill(launch.processes[victim].pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    try:
        _stopped_within(launch, peer, 2.0 + 5)  # peer_timeout + the watchdog's reaction
        log = (launch.folder / f"{peer}.log").read_text()
        assert launch.processes[peer].returncode == wire.EXIT_PEER, log[-2000:]
        said = (launch.folder / f"{peer}.error").read_text()
        # a kill: gloo's receive fails at once, or the store (the target hosts it) is gone; a freeze,
        # or a kill under shared memory, which has no connection to close: only the heartbeat tells
        expected = ("closed its connection", "lost contact") if how == "kill" else ("no sign of life",)
        if transport == "shm" and victim == "draft":
            expected = ("no sign of life",)
        if victim == "target" and how == "freeze":  # the store's host: its store stops answering
            expected = ("lost contact",)
        names_both = f"{peer} process: " in said and f"the {victim}" in said
        assert names_both and any(e in said for e in expected), said
    finally:
        launch.processes[victim].kill()
        launch.processes[victim].wait()
    with pytest.raises(processes.ParallelError, match=f"the {victim}"):
        launch.wait(30)


def test_a_silent_peer_times_out_and_both_stop():
    launch = processes.Launch(_job(max_new_tokens=60, pause=["draft", 0], message_timeout=2.0))
    _paused(launch, "draft")
    _stopped_within(launch, "target", 2.0 + 5)
    _stopped_within(launch, "draft", 5)  # told by the target through the store
    with pytest.raises(processes.ParallelError, match="no SUBTREE from the draft for 2") as error:
        launch.wait(30)
    said = str(error.value)  # the draft learns it from the store, or finds the store gone with the target
    assert "draft process: the target stopped" in said or "lost contact with the target" in said


# --------------------------------------------------------------------------- the command line


def test_generate_parallel_command(capsys):
    from course.__main__ import main

    if runtime.on_gpu() and torch.cuda.device_count() < 2:
        pytest.skip("on a GPU --parallel needs two (the next test checks what it says on one)")
    assert main(["generate", "--parallel", "--prompt", "The old ", "--pair", "tiny", "--max-new-tokens", "4",
                 "--backend", "reference", "--no-progress", "--critical", "1"]) == 0
    out = capsys.readouterr().out
    assert "two processes" in out and "greedy output identical to plain decoding: True" in out
    assert "1 step after each re-root" in out
    assert main(["generate", "--parallel", "--prompt", "The old ", "--pair", "tiny", "--critical", "-1"]) == 2
    assert "error: critical must be an int >= 0" in capsys.readouterr().err
    assert main(["generate", "--prompt", "The old ", "--pair", "tiny", "--critical", "2"]) == 2
    assert "error: --critical is a setting of --parallel" in capsys.readouterr().err


def test_generate_parallel_on_one_gpu_says_what_it_needs(monkeypatch, capsys):
    from course.__main__ import main

    monkeypatch.setattr(runtime, "on_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["generate", "--parallel", "--prompt", "The old "]) == 2
    err = capsys.readouterr().err
    assert "two GPUs" in err and "this machine has 1" in err


# --------------------------------------------------------------------------- the bench and its figures


def test_the_bench_runs_on_the_cpu_and_its_figure_draws(tmp_path):
    """The GPU bench's code, run on the CPU (tiny pair, reference backend): every method's row, in
    the results schema, and parallel.png's figure drawn from them."""
    import matplotlib.pyplot as plt

    from course.capstone import parallel_bench, parallel_figures
    from course.measure import results

    rows = parallel_bench.measure(pair="tiny", n_prompts=1, max_new=6, steps=(1,), repeats=1, cpu=True,
                                  backend="reference", log=lambda *_: None, shape=(8, 2, 4, 4),
                                  wide=(3, (2,), (1,)), queued=(2, (1, 2)))
    names = {(r["name"], r["mode"]) for r in rows}
    assert names == {(n, m) for n in ("autoregressive", "serial decoder", "serial", "parallel")
                     for m in ("greedy", "sample")} | {("queued", "greedy"), ("queued", "sample")}
    queued = [r for r in rows if r["name"] == "queued"]
    assert [(r["mode"], r["steps"], r["width"], r["transport"], r["gpus"]) for r in queued] == [
        (m, d, 2, "device", 0) for m in ("greedy", "sample") for d in (1, 2)]
    assert all(r["tokens_per_call"] >= 1 and 0 <= r["target_wait_ms_median"] < r["median_ms"]
               and r["timeline"] for r in queued)  # the round terms, from a run stamped on the streams
    greedy_queued = [r for r in queued if r["mode"] == "greedy"]
    assert all(r["identical"] for r in greedy_queued)
    assert parallel_figures.best_parallel(rows, "greedy", "queued") == max(greedy_queued,
                                                                           key=lambda r: r["tokens_per_s"])
    measured = [r for r in rows if r["name"] == "parallel"]
    assert {(r["growth"], r["mode"]) for r in measured} == {(g, m) for g in GROWTHS
                                                            for m in ("greedy", "sample")}
    wide = {(r["name"], r["mode"], r["steps"], r.get("critical")) for r in rows if r["width"] == 3}
    assert wide == {(name, m, 2, critical) for name, critical in (("serial", None), ("parallel", 1))
                    for m in ("greedy", "sample")}  # the wide variant and its serial schedule
    assert all(0 <= r["target_wait_ms_median"] < r["median_ms"] for r in measured)
    assert all(0 < r["message_ms_median"] < r["median_ms"] for r in measured)
    assert all(r["verify_gpu_ms"] is None for r in measured)  # timed on a GPU only; this bench ran on the CPU
    decoders = [r for r in rows if r["name"] == "serial decoder"]
    assert len(decoders) == 2 and all(r["tree"] in ("fixed", "sequoia") for r in decoders)  # its best tree
    greedy = [r for r in rows if r["mode"] == "greedy" and r["name"] != "autoregressive"]
    assert all(r["identical"] and r["max_abs_err"] == 0.0 for r in greedy)
    best = parallel_figures.best_parallel(rows)
    assert best["timeline"] and {e["side"] for e in best["timeline"]} == {"draft", "target"}
    assert best["tokens_per_call"] > 1 and best["verify_ms"] > 0 and best["target_calls"] < 6
    document = {"suite": "parallel", "device": "test", "date": "2026-01-01T00:00:00", "software": {},
                "gpus": 0, "rows": rows}
    results.validate(document)
    figure = parallel_figures.measured_figure(document)
    # Which parallel row is fastest on a loaded CPU varies, and its setup decides what the figure can
    # set beside it: timelines of the fastest run, of the same setup with another growth or tree where
    # measured, of the serial schedule at its d and w; then the greedy and the sampling bars.
    setup = (best["steps"], best["width"])
    others = [r for r in measured if r["mode"] == "greedy" and (r["steps"], r["width"]) == setup
              and (r["growth"], r["draft_tree"]) != (best["growth"], best["draft_tree"])]
    assert len(figure.axes) == 1 + min(len(others), 1) + 1 + 2
    plt.close(figure)
    figure = parallel_figures.critical_sweep_figure(rows, 3, base=decoders[0]["tokens_per_s"])
    assert [len(ax.lines) for ax in figure.axes] == [1, 1, 2]  # a line per steps after the re-root; the base
    plt.close(figure)
    with pytest.raises(ValueError, match="width 5"):
        parallel_figures.critical_sweep_figure(rows, 5)
    # the committed file with the most GPUs is the one notebook 20 shows; none: "not measured yet"
    with pytest.raises(results.NotMeasuredYet, match="not measured yet"):
        parallel_bench.load_committed(tmp_path)
    for folder, gpus in (("h100", 1), ("h100x2", 2)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "parallel.json").write_text(json.dumps(document | {"gpus": gpus}))
    assert parallel_bench.load_committed(tmp_path)["gpus"] == 2
    assert [d["gpus"] for d in parallel_bench.committed_documents(tmp_path)] == [2, 1]
    stamped = document | {"suite": "queued_timeline"}  # tools/queued_timeline.py's file, beside it
    (tmp_path / "h100" / "queued_timeline.json").write_text(json.dumps(stamped))
    assert [d["suite"] for d in parallel_bench.committed_documents(tmp_path, "queued_timeline")] == [
        "queued_timeline"]
    # The target counts the fastest of the best parallel row and the best queued row (which of the two
    # is faster on a loaded CPU varies), and no run on fewer than two GPUs meets it.
    speedup, met = parallel_bench.target_met(document)
    fastest = max(best, parallel_figures.best_parallel(rows, "greedy", "queued"),
                  key=lambda r: r["tokens_per_s"])
    assert speedup == fastest["speedup_vs_serial_decoder"] and not met


def test_with_no_d_the_bench_measures_the_baselines_and_the_queued_rounds_alone():
    """steps=() (tools/queued_timeline.py): no serial-schedule or parallel rows, the queued rows
    with the terms of their rounds, and their speedups over the same run's serial decoder."""
    from course.capstone import parallel_bench

    rows = parallel_bench.measure(pair="tiny", n_prompts=1, max_new=6, steps=(), repeats=1, cpu=True,
                                  backend="reference", log=lambda *_: None, shape=(8, 2, 4, 4), wide=None,
                                  queued=(2, (1,)))
    assert [(r["name"], r["mode"]) for r in rows] == [
        (name, mode) for mode in ("greedy", "sample") for name in ("autoregressive", "serial decoder")] + [
        ("queued", "greedy"), ("queued", "sample")]
    for r in rows[-2:]:
        base = next(d for d in rows if d["name"] == "serial decoder" and d["mode"] == r["mode"])
        assert r["speedup_vs_serial_decoder"] == pytest.approx(r["tokens_per_s"] / base["tokens_per_s"])
        assert "target_wait_ms_median" in r and r["timeline"]


def test_the_queued_projection_takes_the_longer_of_the_two_loops():
    """With the hosts only launching, a round lasts the target's loop (its pass, the draft's passes
    between verdict and subtree, the messages) or the draft's (all its passes), whichever is longer."""
    from course.capstone import parallel_bench

    setup = dict(mode="greedy", width=16, growth="likely", draft_tree="device", transport="shm")
    # The serial schedule's pass: 1.0 ms of draft work a round over 5 passes a round = 0.2 ms.
    serial = [dict(setup, name="serial", steps=d, draft_ms_per_round=1.0, draft_calls=50, target_calls=10)
              for d in (2, 8)]
    decoder_row = dict(setup, name="serial decoder", tokens_per_s=1000.0)
    short = dict(setup, name="parallel", steps=2, critical=0, draft_calls=30, target_calls=10,
                 verify_gpu_ms=1.0, tokens_per_call=3.0, speedup_vs_serial_decoder=0.5)
    long_ = dict(short, steps=8, draft_calls=90)
    other = dict(short, width=4)  # another setup: left out
    unmatched = dict(short, steps=4)  # no serial schedule at d = 4: left out
    projected = parallel_bench.queued_projection([*serial, decoder_row, short, long_, other, unmatched],
                                                 0.1, short)
    assert [(p["steps"], p["critical"]) for p in projected] == [(2, 0), (8, 0)]
    by_d = {p["steps"]: p for p in projected}
    # d = 2: 3 passes a round, 1 on the path: the target's loop 1.0 + 0.2 + 0.1, the draft's 0.6 + 0.1.
    assert by_d[2]["target_loop_ms"] == pytest.approx(1.3) and by_d[2]["draft_loop_ms"] == pytest.approx(0.7)
    assert by_d[2]["round_ms"] == pytest.approx(1.3) and by_d[2]["speedup"] == pytest.approx(3.0 / 1.3)
    # d = 8: 9 passes a round, 1 on the path: the draft's loop, 1.8 + 0.1, is the longer.
    assert by_d[8]["target_loop_ms"] == pytest.approx(1.3) and by_d[8]["round_ms"] == pytest.approx(1.9)
    assert by_d[8]["tokens_per_s"] == pytest.approx(3e3 / 1.9) and by_d[8]["measured_speedup"] == 0.5
    import matplotlib.pyplot as plt

    from course.capstone import parallel_figures

    ax = parallel_figures.loops_figure(projected)
    assert [list(line.get_ydata()) for line in ax.lines] == [
        [p[key] for p in projected] for key in ("target_loop_ms", "draft_loop_ms", "round_ms")]
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="no step after the re-root"):
        parallel_figures.loops_figure([dict(p, critical=1) for p in projected])


def test_a_greedy_row_that_leaves_plain_decoding_names_where_and_by_what_gap():
    """first_difference finds where two outputs part; logit_gaps measures the target's preference
    there, with the reference causal pass: positive when plain decoding's token is the argmax."""
    from course.capstone import parallel_bench

    assert parallel_bench.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert parallel_bench.first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert parallel_bench.first_difference([1, 2], [1, 2, 3]) is None  # a shorter output: its length shows it
    made = [decoder.Generation([tokens], 1.0, 0.0, 2, 0) for tokens in ([1, 2, 3], [4, 5, 6], [4, 9, 6])]
    row = parallel_bench._row("serial decoder", "greedy", made[:2], [made[0], made[2]])
    assert not row["identical"] and row["first_difference"] == [dict(prompt=1, token=1, plain=9, got=5)]
    pair = weights.load_pair("tiny", device=runtime.torch_device(), dtype=torch.float32)
    prompt = encode("The old ")
    plain = decoder.autoregressive(pair.target, [prompt], 3, backend="reference")
    first = plain.tokens[0]
    with torch.no_grad():
        logits = pair.target(torch.tensor([prompt + first[:1]], device=pair.target.device))[0, -1]
    other = int(torch.topk(logits, 2).indices[1])
    rows = [{"first_difference": [dict(prompt=0, token=1, plain=first[1], got=other)]}, {"identical": True}]
    parallel_bench.logit_gaps(pair.target, [prompt], [plain], rows)
    gap = rows[0]["first_difference"][0]["logit_gap"]
    assert gap == pytest.approx(float(logits[first[1]] - logits[other])) and gap >= 0
    assert rows[1] == {"identical": True}


def test_the_queued_rounds_figure_draws_a_line_per_way_of_driving_them():
    import matplotlib.pyplot as plt

    from course.capstone import parallel_figures

    rows = [dict(mode=mode, critical_ms=c, wait_ms=c + extra, target_ms=0.5)
            for mode, extra in (("queued", 0.02), ("synced", 0.08)) for c in (0.0, 0.1)]
    ax = parallel_figures.queued_figure({"rows": rows})
    waits = {line.get_label(): [float(y) for y in line.get_ydata()] for line in ax.lines}
    assert waits == {"the draft's GPU work alone": [0.0, 0.1],
                     "queued: the hosts only launch": pytest.approx([0.02, 0.12]),
                     "each host awaits each message": pytest.approx([0.08, 0.18])}
    plt.close(ax.figure)


def test_the_sequence_diagram_draws_every_message_of_its_rounds():
    import matplotlib.pyplot as plt
    from matplotlib.text import Annotation

    from course.capstone import parallel_figures
    from pyspec_ref import parallel_tree as pt

    def model(path):  # a deterministic toy target: the next token leans on the last one
        weights_ = [1.0 + ((path[-1] * 7 + t * 3) % 5) for t in range(5)]
        return [w / sum(weights_) for w in weights_]

    out = pt.simulate_parallel_tree(model, model, [1, 2], 20, tree_size=3, width=1, steps=2)
    ax = parallel_figures.sequence_diagram(out["messages"], out["times"], out["events"], rounds=2)
    arrows = [a for a in ax.texts if isinstance(a, Annotation)]
    labels = [t.get_text() for t in ax.texts if t.get_text().startswith(("SUBTREE", "ACCEPTED", "STOP"))]
    assert len([m for m in out["messages"] if m.round < 2]) == len(arrows) == len(labels) == 4
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="pair up"):
        parallel_figures.sequence_diagram(out["messages"], out["times"][:-1], out["events"])


def test_host_tree_times_equal_the_specifications():
    """The host tree's DFS times (kept children lists, no checks) are `pyspec_ref.trees.dfs_times`."""
    import random

    from course.capstone.host_tree import HostTree, dfs_times_of
    from pyspec_ref import trees

    rng = random.Random(5)
    for n in (1, 2, 7, 40, 110):
        parents = [-1] + [rng.randrange(v) for v in range(1, n)]
        assert dfs_times_of(parents) == trees.dfs_times(parents)
        tree = HostTree.fresh(3, "greedy")
        for v in range(1, n):
            tree._add(parents[v], v, 0.0, 0.0)
        assert tree.dfs_times() == trees.dfs_times(parents)


def test_steps_after_the_re_root_keep_greedy_exact_and_win_back_tokens_per_call(pair, plain):
    """The parallel schedule with `critical` steps after each re-root (`protocol.draft_rounds`): the same
    text, and on this pair more tokens per call than with none (the draft grows where the next root is
    known); `critical` is refused for the serial schedule and when negative."""
    sides = parallel.build_sides(pair.target, pair.draft, max_prompt=len(PROMPT), max_new_tokens=24,
                                 tree_size=8, width=2, steps=2, backend="reference")
    runs = {c: parallel.run_sides(sides, PROMPT, critical=c) for c in (0, 2)}
    assert runs[0].tokens == runs[2].tokens == plain
    assert runs[2].tokens_per_call > runs[0].tokens_per_call
    for schedule, critical in (("serial", 1), ("parallel", -1), ("parallel", True)):
        with pytest.raises(ValueError, match="critical"):
            parallel.run_sides(sides, PROMPT, schedule=schedule, critical=critical)
    with pytest.raises(ValueError, match="critical"):
        processes.check_job(_job(critical=-1))


# --------------------------------------------------------------------------- shared memory


def _mailboxes(tmp_path, tree_size=6, vocab=80):
    return [wire.Mailbox(tmp_path / "mailbox", rank, tree_size, vocab) for rank in (0, 1)]


def test_the_mailbox_carries_each_message_and_its_q(tmp_path):
    target, draft = _mailboxes(tmp_path)
    q = torch.rand((4, 80), generator=torch.Generator().manual_seed(0))
    for round_ in range(3):  # the slots are reused, round after round
        sub = wire.Subtree(round_, [-1, 0, 0, 1], [5, 6, 7 + round_, 8], q + round_)
        draft.send(sub)
        got = target.recv("SUBTREE", with_q=True)
        assert (got.round, got.parents, got.tokens) == (round_, sub.parents, sub.tokens)
        assert torch.equal(got.q, sub.q)
        reply = wire.Reply(wire.ACCEPTED, round_, [0, 2], 9)
        target.send(reply)
        assert draft.recv("ACCEPTED or STOP") == reply


def test_the_mailbox_reads_no_message_before_its_checksum_matches(tmp_path):
    """A processor may show the sequence number before the rest of the message: until the
    checksum matches, the receiver sees nothing, and an older message in the slot never passes for
    the new one."""
    target, draft = _mailboxes(tmp_path)
    draft.send(wire.Subtree(0, [-1, 0], [5, 6]))
    assert target._read(1) is not None and target._read(2) is None
    ints = draft._ints[1]
    ints[0] = 2  # message 2's number, over message 1's bytes and checksum
    assert target._read(2) is None
    draft.sent = 1
    draft.send(wire.Subtree(1, [-1, 0], [5, 7]))
    ints[1] ^= 1  # the checksum not visible yet
    assert target._read(2) is None
    ints[1] ^= 1
    assert target._read(2)[0][wire.HEADER + 6 + 1] == 7  # the second token


def test_the_mailbox_reads_no_q_that_is_part_old_part_new(tmp_path):
    """The checksum covers q too: a slot that shows the new number and ints over rows of q that are
    still the last message's, in part, is not read until they change."""
    target, draft = _mailboxes(tmp_path)
    old = torch.rand((4, 80), generator=torch.Generator().manual_seed(0))
    draft.send(wire.Subtree(0, [-1, 0, 0, 1], [5, 6, 7, 8], old))
    assert target.recv("SUBTREE", with_q=True).round == 0
    new = old + 1
    draft.send(wire.Subtree(1, [-1, 0, 0, 1], [5, 6, 7, 8], new))
    floats = draft._floats[1]
    floats[2, 17] = old[2, 17]  # one word of the new q not visible yet
    assert target._read(2) is None
    floats[2, 17] = new[2, 17]
    assert torch.equal(torch.from_numpy(target._read(2)[1]), new)


def test_the_mailbox_refuses_a_sender_that_does_not_wait_and_a_subtree_without_q(tmp_path):
    target, draft = _mailboxes(tmp_path)
    draft.send(wire.Subtree(0, [-1, 0], [5, 6]))
    with pytest.raises(wire.WireError, match="came without q"):
        target.recv("SUBTREE", with_q=True)
    draft.send(wire.Subtree(1, [-1], [5]))
    draft.send(wire.Subtree(2, [-1], [5]))
    with pytest.raises(wire.WireError, match="sent message 3 before this side read message 2"):
        target.recv("SUBTREE")


def test_a_message_is_timed_from_its_senders_step_to_its_receivers_wait():
    """`parallel_bench._median_message` on hand-made stamps (ms): a receiver already waiting counts
    from the end of the sender's step (the draft's selection, the target's verification); a
    receiver that arrives late (the draft still growing ahead) does not count."""
    from course.capstone import parallel_bench

    def span(side, what, round_, start, end):
        return {"side": side, "what": what, "round": round_, "start": start / 1e3, "end": end / 1e3}

    events = [span("draft", "select", 0, 0.0, 1.0), span("target", "wait", 0, 0.0, 1.2),  # 0.2
              span("target", "verify", 0, 1.2, 2.0), span("draft", "wait", 0, 1.5, 2.5),  # 0.5
              span("draft", "select", 1, 3.0, 4.0), span("target", "wait", 1, 2.1, 4.3),  # 0.3
              span("target", "verify", 1, 4.3, 5.0), span("draft", "wait", 1, 5.5, 5.6)]  # late: not counted
    generation = parallel.ParallelGeneration([1], 1.0, 2, 4, [1, 1], [True], events, "greedy", "parallel",
                                             steps=2, processes=2)
    assert parallel_bench._median_message([generation]) == pytest.approx(0.3)
