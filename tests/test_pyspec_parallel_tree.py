"""pyspec_ref.parallel_tree: SwiftSpec's parallel tree generation (§3.1-3.2) simulated on toy
models. Greedy output equals plain greedy decoding, the draft's KV cache matches its tree after
every re-root, the messages follow the protocol, and sampled tokens follow the target's joint
distribution, over random model pairs (hence random acceptance patterns) and settings."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.measure.stats import chi_square_p_value
from pyspec_ref import parallel_tree as pt

FAST = settings(max_examples=60, deadline=None)


def toy_model(seed: int, vocab: int, context: int = 3, sharpness: float = 2.0):
    """A deterministic next-token distribution of the last `context` tokens of the path."""
    def model(path):
        rng = random.Random(hash((seed, vocab) + tuple(path[-context:])))
        logits = [rng.gauss(0.0, sharpness) for _ in range(vocab)]
        top = max(logits)
        weights = [math.exp(x - top) for x in logits]
        total = sum(weights)
        return [x / total for x in weights]
    return model


def noisy_draft(target, noise, mix: float):
    """The target's distribution mixed with another model's: mix = 0 drafts the target exactly,
    mix = 1 knows nothing of it."""
    def model(path):
        return [(1 - mix) * a + mix * b for a, b in zip(target(path), noise(path), strict=True)]
    return model


@st.composite
def pairs_and_settings(draw):
    vocab = draw(st.integers(2, 7))
    target = toy_model(draw(st.integers(0, 10**6)), vocab, sharpness=draw(st.sampled_from([0.5, 2.0, 5.0])))
    draft = noisy_draft(target, toy_model(draw(st.integers(0, 10**6)), vocab),
                        draw(st.sampled_from([0.0, 0.2, 0.6, 1.0])))
    prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=4))
    tree_size = draw(st.integers(1, 8))
    schedule = draw(st.sampled_from(pt.SCHEDULES))
    options = dict(tree_size=tree_size, width=draw(st.integers(1, tree_size)), steps=draw(st.integers(0, 4)),
                   branch=draw(st.integers(1, 4)), schedule=schedule,
                   growth=draw(st.sampled_from(pt.GROWTHS)),
                   critical=draw(st.integers(0, 2)) if schedule == "parallel" else 0)
    return target, draft, prompt, draw(st.integers(1, 24)), options


@FAST
@given(pairs_and_settings(), st.data())
def test_greedy_equals_plain_decoding_and_every_invariant_holds(case, data):
    target, draft, prompt, n, options = case
    eos = data.draw(st.one_of(st.none(), st.integers(0, 6)))
    out = pt.simulate_parallel_tree(target, draft, prompt, n, eos=eos, check=True, **options)
    assert out["tokens"] == pt.greedy_decode(target, prompt, n, eos=eos)
    assert out["target_calls"] == len(out["rounds"]) == len(out["messages"]) // 2
    assert all(1 <= len(m.parents) <= options["tree_size"] for m in out["messages"][::2])
    # every round emits its accepted tokens plus the target's own next token
    # (divided as the specification divides: a product of the rounded quotient can miss by one ulp)
    assert sum(r["accepted"] + 1 for r in out["rounds"]) / out["target_calls"] == out["tokens_per_call"]


@FAST
@given(pairs_and_settings())
def test_a_perfect_draft_gets_a_token_accepted_every_round(case):
    """With draft = target, the most probable non-root node is the root's best child, which is the
    target's argmax: every subtree of two nodes or more gets at least one token accepted."""
    target, _, prompt, n, options = case
    out = pt.simulate_parallel_tree(target, target, prompt, n, **options)
    for message, reply in zip(out["messages"][::2], out["messages"][1::2], strict=True):
        assert len(reply.path) >= min(2, len(message.parents))


def test_the_schedules_differ_only_in_when_the_draft_works():
    target = toy_model(1, 6)
    draft = noisy_draft(target, toy_model(2, 6), 0.3)
    runs = {(s, d): pt.simulate_parallel_tree(target, draft, [1, 2, 3], 40, tree_size=8, width=4, steps=d,
                                              branch=3, schedule=s) for s in pt.SCHEDULES for d in (0, 2)}
    # no concurrent steps: the two schedules are one algorithm, message for message
    assert runs["parallel", 0]["messages"] == runs["serial", 0]["messages"]
    par, ser = runs["parallel", 2], runs["serial", 2]
    assert par["tokens"] == ser["tokens"] == pt.greedy_decode(target, [1, 2, 3], 40)
    # the parallel draft's steps overlap verification: less time on the clock per token
    assert par["time"] / par["target_calls"] < ser["time"] / ser["target_calls"]
    # its target waits less, and the draft's idle time is spent waiting for ACCEPTED
    waits = {name: sum(e["end"] - e["start"] for e in run["events"] if e["side"] == "target"
                       and e["what"] == "wait") for name, run in (("par", par), ("ser", ser))}
    assert waits["par"] < waits["ser"]
    assert any(r["reused"] and r["kept"] > 1 for r in par["rounds"])  # grown-ahead subtrees survive


def test_the_queued_schedule_sends_each_subtree_right_after_the_reroot(monkeypatch):
    """Between a verdict and the next SUBTREE the queued draft runs no pass: not the new root's, not a
    top-up, not an accepted leaf's (its KV is owed to the next pass, and the cache check after the
    growth finds it written)."""
    owed = []
    real_owe = pt._Draft._owe
    monkeypatch.setattr(pt._Draft, "_owe", lambda self, *a: owed.append(1) or real_owe(self, *a))
    target = toy_model(1, 6)
    draft = noisy_draft(target, toy_model(2, 6), 0.3)
    rounds = []
    for seed, mode in ((0, "greedy"), (1, "sample")):
        out = pt.simulate_parallel_tree(target, draft, [1, 2, 3], 60, tree_size=5, width=2, steps=2, branch=2,
                                        mode=mode, schedule="queued", growth="likely", seed=seed, check=True)
        after_verdict = [e for e in out["events"]
                         if e["side"] == "draft" and e["what"] in ("grow", "re-root")]
        assert [e["round"] for e in after_verdict] == [0]  # only the first tree, before any verdict
        rounds += out["rounds"][:-1]
        if mode == "greedy":
            assert out["tokens"] == pt.greedy_decode(target, [1, 2, 3], 60)
    assert any(not r["reused"] for r in rounds)  # a re-root that kept no subtree: a fresh root,
    assert any(r["sent"] == 1 for r in rounds)  # sent alone
    assert owed  # an accepted leaf was committed unrun


def test_likely_growth_runs_the_leaves_sent_only_for_their_children():
    """Ahead of a verdict, growth "likely" ranks a leaf under verification below an unsent
    candidate of the same key (the leaf leaves the tree at the re-root whatever the verdict), by
    the draft's top probability at its parent; every other step keeps the best keys."""
    target = toy_model(5, 5)
    draft = noisy_draft(target, toy_model(6, 5), 0.3)
    dr = pt._Draft(draft, "greedy", 2, random.Random(0), 5, growth="likely")
    dr.fresh(3)
    dr.step(2)  # the root: its candidates queue
    dr.select(3)
    leaf = next(s for s in dr.sent if isinstance(s, tuple))
    twin = (leaf[0], -1, *leaf[2:])  # the same key, not sent
    assert dr.survival(leaf) == pytest.approx(-leaf[0] + math.log(max(dr.q[leaf[2]])))
    assert dr.survival(twin) == -leaf[0] > dr.survival(leaf)
    serial, parallel = ([pt.simulate_parallel_tree(target, draft, [1, 2], 30, tree_size=8, width=2, steps=4,
                                                   branch=2, growth=g, schedule=s)["messages"]
                         for g in pt.GROWTHS] for s in ("serial", "parallel"))
    assert serial[0] == serial[1]  # the serial schedule takes no step ahead: the growths agree
    assert parallel[0] != parallel[1]  # the parallel one does, and there they differ


def test_the_clock_orders_every_message():
    target = toy_model(3, 5)
    out = pt.simulate_parallel_tree(target, noisy_draft(target, toy_model(4, 5), 0.4), [0, 1], 16,
                                    tree_size=4, width=2, steps=2)
    for side in ("draft", "target"):
        events = [e for e in out["events"] if e["side"] == side]
        # one thing at a time on each side
        assert all(a["end"] <= b["start"] + 1e-12 for a, b in itertools.pairwise(events))
    verifies = [e for e in out["events"] if e["what"] == "verify"]
    assert len(verifies) == out["target_calls"]
    assert out["time"] == pytest.approx(verifies[-1]["end"])


# --------------------------------------------------------------------------- the checks can fail


def _one_reroot():
    """A draft that has sent a subtree, grown meanwhile and re-rooted: its state and the result."""
    target = toy_model(5, 5)
    dr = pt._Draft(noisy_draft(target, toy_model(6, 5), 0.3), "greedy", 2, random.Random(0), 5)
    dr.prefix = [1, 2]
    dr.cache = [(-1, (1,)), (-2, (1, 2))]
    dr.fresh(3)
    for _ in range(4):
        dr.step(2)
    sent = dr.select(4)
    for _ in range(3):
        dr.step(2)
    rows = [target(path) for path in _paths(dr.prefix, sent.parents, sent.tokens)]
    best = [max(range(5), key=lambda t, p=p: p[t]) for p in rows]
    path, nxt = pt.greedy_tree_verification(list(sent.parents), list(sent.tokens), best)
    return dr, dr.reroot(path, nxt)


def _paths(prefix, parents, tokens):
    out = []
    for j in range(len(parents)):
        up, v = [], j
        while v >= 0:
            up.append(tokens[v])
            v = parents[v]
        out.append(tuple(prefix) + tuple(reversed(up)))
    return out


def _check(dr):
    pt.check_draft_cache(dr.prefix, dr.parents, dr.tokens, dr.run, dr.birth, dr.cache)


def test_the_draft_cache_check_catches_lost_moved_and_duplicated_entries():
    dr, done = _one_reroot()
    _check(dr)  # the real re-root keeps the invariant
    assert done["moves"] and all(src > dst for src, dst in done["moves"])
    P = len(dr.prefix)
    survivors = [P + v for v in range(len(dr.parents)) if dr.run[v]]
    assert len(survivors) >= 2, "the case must keep a subtree to be worth checking"
    lost = list(dr.cache)
    lost[survivors[-1]] = None
    swapped = list(dr.cache)
    swapped[survivors[0]], swapped[survivors[1]] = swapped[survivors[1]], swapped[survivors[0]]
    duplicated = list(dr.cache)
    duplicated[survivors[1]] = (duplicated[survivors[0]][0], duplicated[survivors[1]][1])
    stale_prefix = list(dr.cache)
    stale_prefix[P - 1] = dr.cache[P]
    for broken, why in ((lost, "lost"), (swapped, "wrong row"), (duplicated, "duplicated"),
                        (stale_prefix, "committed")):
        dr.cache, keep = broken, dr.cache
        with pytest.raises(AssertionError, match=why):
            _check(dr)
        dr.cache = keep


def test_the_message_log_check_catches_disorder():
    target = toy_model(7, 4)
    log = pt.simulate_parallel_tree(target, target, [1, 2], 8, tree_size=3, width=1, steps=1)["messages"]
    pt.check_message_log(log, 3)
    with pytest.raises(AssertionError, match="expected ACCEPTED or STOP"):
        pt.check_message_log([log[0], log[0], *log[2:]], 3)
    with pytest.raises(AssertionError, match="does not end with STOP"):
        pt.check_message_log(log[:-1], 3)
    bad_path = pt.Message(log[1].kind, log[1].round, path=(0, 0), next_token=1)
    with pytest.raises(AssertionError, match="not a root path"):
        pt.check_message_log([log[0], bad_path, *log[2:]], 3)
    with pytest.raises(AssertionError, match="SUBTREE of 3 nodes"):
        pt.check_message_log(log, 2)


def test_the_target_refuses_a_subtree_not_rooted_at_its_last_token():
    tg = pt._Target(toy_model(8, 4), "greedy", random.Random(0), 4, prefix=[1], cache=[(1,)])
    with pytest.raises(ValueError, match="did not re-root"):
        tg.verify(pt.Message(pt.SUBTREE, 3, (-1, 0), (2, 1)), root_token=0)


def test_bad_options_are_named():
    m = toy_model(0, 3)
    for kwargs, match in ((dict(tree_size=0), "tree_size"), (dict(width=0), "width"),
                          (dict(steps=-1), "steps"), (dict(branch=0), "branch"), (dict(mode="beam"), "mode"),
                          (dict(schedule="x"), "schedule"), (dict(growth="wide"), "growth"),
                          (dict(critical=-1), "critical"), (dict(schedule="serial", critical=1), "critical")):
        with pytest.raises(ValueError, match=match):
            pt.simulate_parallel_tree(m, m, [1], 4, **kwargs)
    with pytest.raises(ValueError, match="prompt"):
        pt.simulate_parallel_tree(m, m, [], 4)
    with pytest.raises(ValueError, match="draft"):
        pt.simulate_parallel_tree(m, lambda path: [0.5, 0.5], [1], 4)  # a draft of another vocabulary


# --------------------------------------------------------------------------- sampling is exact


def _joint(model, prompt, n):
    """The exact joint distribution of the next n tokens, by enumeration."""
    vocab = len(model(tuple(prompt)))
    out = {}
    for seq in itertools.product(range(vocab), repeat=n):
        prob, path = 1.0, tuple(prompt)
        for t in seq:
            prob *= model(path)[t]
            path += (t,)
        out[seq] = prob
    return out


@pytest.mark.parametrize("growth, critical, schedule", [(growth, 0, "parallel") for growth in pt.GROWTHS]
                         + [("likely", 1, "parallel"), ("likely", 0, "queued")])
def test_sampled_tokens_follow_the_target_joint_distribution(growth, critical, schedule):
    """The first three tokens of many seeded runs against the target's exact joint distribution:
    the second and third tokens come from rounds whose trees reuse subtrees grown ahead (and, with
    `critical`, grown again after the re-root)."""
    vocab, n, runs = 3, 3, 3000
    target = toy_model(11, vocab, context=2, sharpness=1.0)
    draft = noisy_draft(target, toy_model(12, vocab, context=2, sharpness=1.5), 0.5)
    want = _joint(target, [0, 1], n)
    counts = dict.fromkeys(want, 0)
    reused = accepted = 0
    for seed in range(runs):
        out = pt.simulate_parallel_tree(target, draft, [0, 1], n, tree_size=3, width=2, steps=2, branch=2,
                                        mode="sample", growth=growth, critical=critical, schedule=schedule,
                                        seed=1000 * seed, check=False)
        counts[tuple(out["tokens"])] += 1
        reused += sum(r["kept"] > 1 for r in out["rounds"])
        accepted += sum(r["accepted"] for r in out["rounds"])
    assert reused > runs // 20 and accepted > runs  # the reuse and the tree walk are exercised
    keys = sorted(want)
    assert chi_square_p_value([counts[k] for k in keys], [want[k] for k in keys], pool_below=5) > 1e-3
    # the test has power: the draft's joint distribution is rejected
    wrong = _joint(draft, [0, 1], n)
    assert chi_square_p_value([counts[k] for k in keys], [wrong[k] for k in keys], pool_below=5) < 1e-3


def _sampled_p_value(growth: str, runs: int = 3000) -> float:
    """Chi-square p-value of the first three tokens against the target's joint distribution, with a
    draft that is confident and often wrong: verification then often reaches a second sibling."""
    target = toy_model(11, 3, context=2, sharpness=1.0)
    draft = noisy_draft(target, toy_model(12, 3, context=2, sharpness=4.0), 0.9)
    want = _joint(target, [0, 1], 3)
    counts = dict.fromkeys(want, 0)
    for seed in range(runs):
        out = pt.simulate_parallel_tree(target, draft, [0, 1], 3, tree_size=3, width=2, steps=2, branch=2,
                                        mode="sample", growth=growth, seed=1000 * seed, check=False)
        counts[tuple(out["tokens"])] += 1
    keys = sorted(want)
    return chi_square_p_value([counts[k] for k in keys], [want[k] for k in keys], pool_below=5)


def test_siblings_drawn_without_replacement_are_verified_as_such(monkeypatch):
    """A node's siblings are draws without replacement (Sequoia §3.2): verified so, the tokens
    follow the target; verified as SpecInfer's independent draws (with replacement), they do not,
    which the test detects."""
    assert _sampled_p_value("likely") > 1e-3
    verify = pt.tree_speculative_sampling
    monkeypatch.setattr(pt, "tree_speculative_sampling",
                        lambda *a, **k: verify(*a, **(k | {"replacement": True})))
    assert _sampled_p_value("likely") < 1e-3
