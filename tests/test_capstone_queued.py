"""The queued rounds (`course.capstone.queued`, notebook 20 §8) off a GPU, on the tiny pair: the same
rounds as the queued schedule run lockstep, greedy output equal to plain decoding, the target's
round read from the packet alone, and bad input refused. On a GPU the same code runs on two
streams; `tools/gpu_parallel.sh` measures it."""

from __future__ import annotations

import itertools

import pytest
import torch

import course  # noqa: F401  (first: chooses the simulator / interpreter)
from course.capstone import decoder, parallel, queued, weights
from course.capstone.text import encode
from course.core import runtime

PROMPT = encode("The old man and the sea ")
NEW = 24


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return weights.load_pair("tiny", device=runtime.torch_device(), dtype=torch.float32)


@pytest.fixture(scope="module")
def plain(pair):
    return decoder.autoregressive(pair.target, [PROMPT], NEW, backend="reference").tokens[0]


def _settings(tree_size, width, steps, mode="greedy"):
    return dict(tree_size=tree_size, width=width, steps=steps, branch=2, mode=mode, backend="reference")


def _built(pair, tree_size, width, steps, mode="greedy"):
    return queued.build(pair.target, pair.draft, max_prompt=len(PROMPT), max_new_tokens=NEW,
                        **_settings(tree_size, width, steps, mode))


@pytest.mark.parametrize("tree_size, width, steps", [(8, 2, 2), (6, 3, 1), (4, 2, 3), (8, 2, 0)])
def test_the_queued_rounds_are_the_queued_schedules_rounds(pair, plain, tree_size, width, steps):
    """Greedy output equals plain decoding, and round for round the verdicts and re-roots are those
    of the queued schedule run lockstep (its subtrees padded to tree_size, the target's inputs read
    from the packet on the device); built sides serve a second run alike."""
    sides = _built(pair, tree_size, width, steps)
    got = sides.run(PROMPT, NEW)
    lockstep = parallel.generate(pair.target, pair.draft, PROMPT, NEW, schedule="queued",
                                 **_settings(tree_size, width, steps))
    assert got.tokens == plain == lockstep.tokens
    assert got.accepted == lockstep.accepted and got.reused == lockstep.reused
    assert got.target_calls == lockstep.target_calls and got.draft_calls >= lockstep.draft_calls
    again = sides.run(PROMPT, NEW)
    assert (again.tokens, again.accepted, again.reused) == (got.tokens, got.accepted, got.reused)
    shorter = sides.run(PROMPT[:6], 5)
    assert shorter.tokens == decoder.autoregressive(pair.target, [PROMPT[:6]], 5,
                                                    backend="reference").tokens[0]


@pytest.mark.parametrize("tree_size, width, steps", [(8, 2, 2), (4, 2, 3)])
def test_sampled_queued_rounds_draw_the_lockstep_schedules_tokens(pair, tree_size, width, steps):
    """Sampling: the draft's distributions travel with the packet and both sides take their uniforms
    from pools filled ahead, so for the same seeds the queued rounds emit the lockstep queued
    schedule's tokens, round for round (that schedule's tokens follow the target's distribution:
    `pyspec_ref.parallel_tree`'s chi-square test)."""
    sides = _built(pair, tree_size, width, steps, mode="sample")
    for seed in (0, 5):
        got = sides.run(PROMPT, NEW, seed=seed)
        lockstep = parallel.generate(pair.target, pair.draft, PROMPT, NEW, schedule="queued", seed=seed,
                                     **_settings(tree_size, width, steps, "sample"))
        assert got.tokens == lockstep.tokens and got.accepted == lockstep.accepted
        assert got.reused == lockstep.reused and sum(got.accepted) > 0


def _assert_rounds_in_order(generation, skew_s: float = 0.0) -> None:
    """A timeline of the queued rounds: each side's spans follow one another, the target verifies
    each round once (the last one spare), each verification starts after its SUBTREE was selected,
    and each re-root after the verdict it acts on. skew_s: how far the two sides' clocks may be
    apart (two GPUs: two zeros)."""
    events, rounds = generation.events, len(generation.accepted)
    for side in ("draft", "target"):
        spans = [(e["start"], e["end"]) for e in events if e["side"] == side]
        assert all(start <= end for start, end in spans)
        assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))
    span = {(e["side"], e["what"], e["round"]): e for e in events}
    assert [e["round"] for e in events if e["what"] == "verify"] == list(range(rounds + 1))
    for r in range(rounds + 1):
        assert span["target", "verify", r]["start"] >= span["draft", "select", r]["end"] - skew_s
    for r in range(rounds):
        assert span["draft", "re-root", r]["start"] >= span["target", "verify", r]["end"] - skew_s


def test_a_timed_run_stamps_every_round_and_changes_nothing(pair, plain):
    """timeline=True: the same tokens and rounds, and each side's spans in the order the messages
    impose; the bench's round terms (the target's wait among them) read from them. Untimed runs
    record no spans."""
    from course.capstone import parallel_bench

    sides = _built(pair, 8, 2, 2)
    timed = sides.run(PROMPT, NEW, timeline=True)
    untimed = sides.run(PROMPT, NEW)
    assert timed.tokens == untimed.tokens == plain and timed.accepted == untimed.accepted
    assert untimed.events == []
    _assert_rounds_in_order(timed)
    kinds = {(e["side"], e["what"]) for e in timed.events}
    assert kinds == {("draft", k) for k in ("grow", "grow ahead", "wait", "re-root", "select")} | {
        ("target", "wait"), ("target", "verify")}
    terms = parallel_bench.round_terms([timed])
    assert 0 <= terms["target_wait_ms_median"] and terms["timeline"]


def test_an_end_token_truncates_the_output(pair, plain):
    sides = _built(pair, 8, 2, 2)
    eos = plain[5]
    got = sides.run(PROMPT, NEW, eos=eos)
    assert got.tokens == plain[:plain.index(eos) + 1]


def test_the_targets_round_reads_the_packet_and_commits_on_the_device(pair):
    """A packet with padding: the verdict's path stays among the real items, the reply holds it in
    the draft's layout, and the committed prefix and the emitted tokens move by its length."""
    sides = _built(pair, 4, 2, 1)
    target = sides.target
    target.start(PROMPT, 1)
    best = decoder.autoregressive(pair.target, [PROMPT], 2, backend="reference").tokens[0]
    # root, its child holding the target's next token, and two padding items
    n = 4
    packet = torch.tensor([-1, 0, -1, -1, PROMPT[-1], best[0], 0, 0, 0, 1, 0, 0,
                           0, 1, 2 ** 31 - 1, 2 ** 31 - 1, 1, 1, -1, -1])
    target.inbox.copy_(packet)
    prefix = int(target.prefix)
    target.round()
    k1, nxt, *path = target.reply.tolist()
    assert (k1, path[:k1], nxt) == (2, [0, 1], best[1])
    assert all(j == -1 for j in path[k1:]) and len(path) == n
    assert int(target.prefix) == prefix + 2 and int(target.count) == 2
    assert target.out[:2].tolist() == best[:2]


def test_bad_settings_and_runs_are_refused(pair):
    room = dict(max_prompt=len(PROMPT), max_new_tokens=NEW)
    with pytest.raises(ValueError, match="draft's tree on the device"):
        queued.build(pair.target, pair.draft, **room, draft_tree="host", **_settings(4, 2, 1))
    sides = queued.build(pair.target, pair.draft, **room, **_settings(4, 2, 1))
    for bad in (NEW + 1, 0, True, 2.0):
        with pytest.raises(ValueError, match=r"max_new_tokens must be an int in \[1, 24\]"):
            sides.run(PROMPT, bad)
    with pytest.raises(ValueError, match="a prompt of 25 tokens"):
        sides.run(PROMPT + [1], 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and the kernels backend need a GPU")
def test_on_a_gpu_the_graphed_queued_rounds_equal_plain_decoding():
    """The course's kernels, every side's work a CUDA graph, the two streams ordered by events alone:
    greedy output equal to plain decoding, on one GPU (and with two, the draft on the second);
    sampling repeats its draws for the same seeds."""
    loaded = weights.load_pair("small", device="cuda:0", dtype=torch.float16)
    draft = loaded.draft
    if torch.cuda.device_count() >= 2:
        draft = weights.load_pair("small", device="cuda:1", dtype=torch.float16).draft
    plain = decoder.autoregressive(loaded.target, [PROMPT], 48).tokens[0]
    sides = queued.build(loaded.target, draft, max_prompt=len(PROMPT), max_new_tokens=48, tree_size=16,
                         width=4, steps=3, branch=4, mode="greedy")
    for _ in range(3):
        got = sides.run(PROMPT, 48)
        assert got.tokens == plain and got.tokens_per_call > 1.5
    timed = sides.run(PROMPT, 48, timeline=True)  # stamped on the streams: their order is the GPUs'
    assert timed.tokens == plain
    _assert_rounds_in_order(timed, skew_s=1e-4 if draft.device != loaded.target.device else 0.0)
    assert all(e["gpu_ms"] > 0 for e in timed.events if e["what"] == "verify")
    sampling = queued.build(loaded.target, draft, max_prompt=len(PROMPT), max_new_tokens=48, tree_size=16,
                            width=4, steps=3, branch=4, mode="sample")
    first = sampling.run(PROMPT, 48, seed=3)
    again = sampling.run(PROMPT, 48, seed=3)  # the same seeds, the same graphs: the same draws
    assert first.tokens == again.tokens and first.tokens_per_call > 1.5
