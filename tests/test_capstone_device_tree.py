"""The parallel draft's tree on the device (notebook 20, §8): the same tree as the host's, message for
message; its Triton kernels equal to its PyTorch form, table for table; DFS times kept exact; bad
input refused. On the CPU: the tiny pair, the reference backend, Triton's interpreter."""

from __future__ import annotations

import random

import pytest
import torch

import course  # noqa: F401  (first: chooses the simulator / interpreter)
from course.capstone import decoder, parallel, weights
from course.capstone.device_side import DeviceDraftSide, _Pass
from course.capstone.device_tree import DeviceTree
from course.capstone.host_tree import dfs_times_of
from course.capstone.protocol import Timeline, draft_rounds, run_lockstep, target_rounds
from course.capstone.side_steps import UniformPool
from course.capstone.sides import DraftSide, TargetSide
from course.capstone.text import encode
from course.core import runtime

PROMPT = encode("The old man and the sea ")
TABLES = ("parent", "token", "depth", "cum", "key", "top", "run", "sent", "slot", "start", "end")
COUNTS = ("count", "used", "prefix", "owed", "owed_token")


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return weights.load_pair("tiny", device=runtime.torch_device(), dtype=torch.float32)


def _generation(pair, side_class, mode, size, width, steps, schedule, growth, new=20):
    """Tokens, accepted counts, re-roots kept, draft calls and every SUBTREE message (parents, tokens)."""
    cfg = decoder.settings(size, width, None, mode=mode)
    draft = side_class(pair.draft, cfg, steps, max_prompt=len(PROMPT), max_new_tokens=new,
                       backend="reference", growth=growth)
    target = TargetSide(pair.target, cfg, max_prompt=len(PROMPT), max_new_tokens=new, backend="reference")
    draft.start(PROMPT, 3)
    target.start(PROMPT, 4)
    sent = []

    def recording(worker):
        reply = None
        try:
            while True:
                message = worker.send(reply)
                if not isinstance(message, str):
                    sent.append((message.parents, message.tokens))
                reply = yield message
        except StopIteration as finished:
            return finished.value

    clock = Timeline()
    reused, (tokens, accepted) = run_lockstep(recording(draft_rounds(draft, steps, schedule, clock)),
                                              target_rounds(target, new, None, clock))
    return tokens, accepted, reused, draft.calls, sent


@pytest.mark.parametrize("mode", ["greedy", "sample"])
@pytest.mark.parametrize("size, width, steps, schedule, growth",
                         [(8, 2, 3, "parallel", "likely"), (6, 3, 1, "serial", "best"),
                          (4, 2, 2, "parallel", "best")])
def test_the_device_tree_sends_the_host_trees_messages(pair, mode, size, width, steps, schedule, growth):
    host = _generation(pair, DraftSide, mode, size, width, steps, schedule, growth)
    device = _generation(pair, DeviceDraftSide, mode, size, width, steps, schedule, growth)
    assert device == host


def test_a_uniform_pool_that_refills_every_pass_changes_no_message(pair, monkeypatch):
    """Sampling's uniforms reach the device many passes at a time (`UniformPool`); refilled before
    almost every pass, the pool still hands each pass the host tree's rows."""
    monkeypatch.setattr(UniformPool, "BYTES", 1)  # room for one pass of the largest size
    host = _generation(pair, DraftSide, "sample", 8, 2, 3, "parallel", "likely")
    device = _generation(pair, DeviceDraftSide, "sample", 8, 2, 3, "parallel", "likely")
    assert device == host


def _random_root_path(parents: list[int], rng: random.Random) -> list[int]:
    path = [0]
    while True:
        kids = [j for j in range(len(parents)) if parents[j] == path[-1]]
        if not kids or rng.random() < 0.3:
            return path
        path.append(rng.choice(kids))


def _side(pair, mode, size, width, steps, branch, kernels):
    cfg = decoder.settings(size, width, branch, mode=mode)
    side = DeviceDraftSide(pair.draft, cfg, steps, max_prompt=len(PROMPT), max_new_tokens=40,
                           backend="reference")
    side.tree.kernels = kernels
    side.start(PROMPT, 5)
    return side


@pytest.mark.parametrize("mode, size, width, steps, branch, chunk",
                         [("greedy", 8, 2, 2, None, 256), ("sample", 6, 3, 1, 3, 256),
                          ("greedy", 5, 1, 3, 2, 256), ("greedy", 8, 2, 2, None, 4),
                          ("sample", 6, 3, 1, 3, 4)])
def test_the_kernels_equal_the_pytorch_form(pair, mode, size, width, steps, branch, chunk, monkeypatch):
    """Both forms through growth, selection and re-roots on random accepted paths: every live row of
    every table, the counts, the messages and the committed KV rows stay equal; with chunks of 4
    rows, the kernels' loops over the live rows take many turns, as a large tree's do."""
    from course.capstone import device_tree_kernels

    monkeypatch.setattr(device_tree_kernels, "RANK_CHUNK", chunk)
    torch_form = _side(pair, mode, size, width, steps, branch, kernels=False)
    kernel_form = _side(pair, mode, size, width, steps, branch, kernels=True)
    rng = random.Random(1)
    for round_ in range(5):
        for side in (torch_form, kernel_form):
            side.grow(steps, ahead=round_ % 2 == 1)
        sent = torch_form.subtree()
        assert kernel_form.subtree()[:2] == sent[:2]
        live = int(torch_form.tree.count)
        ranks = torch_form.tree.ranks()  # the selection's ranks, counted by the kernel into scratch
        assert torch.equal(kernel_form.tree.scratch[:live], ranks)
        assert sorted(ranks.tolist()) == list(range(live))  # a total order: every rank once
        for name in TABLES:
            rows = [getattr(side.tree, name)[:live] for side in (kernel_form, torch_form)]
            assert torch.equal(*rows), name
        path = _random_root_path(sent[0], rng)
        next_token = rng.choice([*sent[1], rng.randrange(20)])
        for side in (torch_form, kernel_form):
            side.reroot(path, next_token)
        for name in COUNTS:
            assert torch.equal(getattr(kernel_form.tree, name), getattr(torch_form.tree, name)), name
        committed = int(torch_form.tree.prefix) - int(torch_form.tree.owed)
        assert torch.equal(kernel_form.cache.data[:, :, :committed], torch_form.cache.data[:, :, :committed])


def test_a_selection_larger_than_the_tree_is_padded_in_both_forms(pair):
    """The queued rounds select tree_size items whatever the tree holds (`DeviceTree.packet`): past
    the live rows, padding that no query sees; the live part is what a selection of the live rows
    sends, parents, tokens, depths and DFS times."""
    from course.capstone.device_tree import DEAD_END, DEAD_START

    size = 8
    for kernels in (False, True):
        side = _side(pair, "greedy", size, 2, 2, 2, kernels=kernels)
        tree = side.tree
        tree.select(size)
        root = PROMPT[-1]
        pads = size - 1
        assert tree.packet(size).tolist() == ([-1] * size + [root] + [0] * pads + [0] * size
                                              + [0] + [DEAD_START] * pads + [0] + [DEAD_END] * pads)
        side._run(1)  # the root's pass alone (as the growth's first pass): three rows, short of size
        live = int(tree.count)
        assert live == 3
        exact = tree.select(live).tolist()
        times = [getattr(tree, name)[tree.msg_rows[:live]].tolist() for name in ("depth", "start", "end")]
        packet = tree.packet(size)
        tree.select(size)
        padded = tree.packet(size).view(5, size).tolist()
        assert padded[0] == exact[:live] + [-1] * (size - live)
        assert padded[1] == exact[live:] + [0] * (size - live)
        assert [part[:live] for part in padded[2:]] == times
        assert [part[live:] for part in padded[2:]] == [[0] * 5, [DEAD_START] * 5, [DEAD_END] * 5]
        assert packet.data_ptr() == tree.message.data_ptr()


@pytest.mark.parametrize("branch", [1, 3, 4])
def test_the_greedy_children_kernel_picks_what_the_stable_sort_picks(branch):
    """`device_tree_kernels.best_children` against `tree.top_children`: the same tokens in the same
    order, ties (frequent in float16 logits) to the lower token id, and the same values."""
    from course.capstone import device_tree_kernels
    from course.capstone.tree import top_children

    gen = torch.Generator().manual_seed(branch)
    logits = torch.randint(-6, 3, (7, 20), generator=gen).float()  # few distinct values: many ties
    logits[3] = 1.0  # a row of equals
    logq = torch.log_softmax(logits, -1).to(runtime.torch_device())
    want = top_children(logq, branch)
    got = device_tree_kernels.best_children(logq, branch)
    for name, a, b in zip(("tokens", "log-probabilities", "top"), got, want, strict=True):
        assert torch.equal(a, b), name
    assert want[0][3].tolist() == list(range(branch))


@pytest.mark.parametrize("branch", [1, 4])
def test_the_sampled_children_kernel_draws_what_gumbel_top_k_draws(branch):
    """`device_tree_kernels.best_children` with uniforms against the PyTorch form
    (`tree.gumbel_top_k`, the picks' log-probabilities, each row's largest), uniforms of exactly 0
    included (clamped, as the PyTorch form clamps them)."""
    from course.capstone import device_tree_kernels

    device = runtime.torch_device()
    gen = torch.Generator().manual_seed(branch)
    logq = torch.log_softmax(torch.randn((9, 20), generator=gen), -1).to(device)
    uniforms = torch.rand((9, 20), generator=gen, dtype=torch.float64)
    uniforms[2, 5] = 0.0
    uniforms = uniforms.to(device)
    tree = DeviceTree(8, 4, branch, "sample", 20, device)  # the PyTorch form
    want = tree.best_children(logq, uniforms)
    got = device_tree_kernels.best_children(logq, branch, uniforms)
    for name, a, b in zip(("tokens", "log-probabilities", "top"), got, want, strict=True):
        assert torch.equal(a, b), name


def test_dfs_times_stay_exact_through_growth_and_re_roots(pair):
    side = _side(pair, "greedy", 12, 3, 3, 3, kernels=False)
    rng = random.Random(0)
    for _ in range(8):
        side.grow(2, ahead=True)
        live = int(side.tree.count)
        start, end = dfs_times_of(side.tree.parent[:live].tolist())
        assert side.tree.start[:live].tolist() == start and side.tree.end[:live].tolist() == end
        parents, tokens, _ = side.subtree()
        side.reroot(_random_root_path(parents, rng), rng.choice([*tokens, rng.randrange(20)]))


def test_a_graph_captures_warm_up_stays_in_the_tables(pair):
    """A CUDA graph's capture first runs its body on a one-row tree (`DeviceDraftSide._capture`): every
    kernel must stay inside its tables there too (the interpreter checks each access)."""
    side = _side(pair, "greedy", 6, 3, 1, None, kernels=True)
    tree, reply = side.tree, side.reply
    reply[0] = 1
    bodies = [_Pass(side, width, owed) for width, owed in ((6, False), (1, True), (3, False))]
    bodies += [lambda: tree.select(6), lambda: tree.reroot(reply[2:], reply[:1], reply[1:2], side.moves,
                                                            side.compactor)]
    for body in bodies:
        tree.reset(0, 1)
        tree.select(1)
        for _ in range(3):
            body()


def test_bad_replies_and_overflow_are_refused(pair):
    side = _side(pair, "greedy", 6, 3, 1, None, kernels=False)
    side.grow(1)
    side.subtree()
    not_a_path = [0, 1, 1]  # node 1's parent is the root, not node 1
    before = {name: getattr(side.tree, name).clone() for name in TABLES + COUNTS}
    for path, token, named in [([], 1, "path"), ([1], 1, "path"), (not_a_path, 1, "path"),
                               ([0], -1, "next_token"), ([0], pair.draft.config.vocab_size, "next_token")]:
        with pytest.raises(ValueError, match=named):
            side.reroot(path, token)
    for name, value in before.items():  # nothing was written
        assert torch.equal(getattr(side.tree, name), value), name
    side.n_nodes = side.tree.slots  # as if every node slot were taken: the next pass must not run
    with pytest.raises(ValueError, match="overflow"):
        side._run(1)


def test_greedy_with_the_kernels_equals_plain_decoding(pair):
    plain = decoder.autoregressive(pair.target, [PROMPT], 5, backend="reference").tokens[0]
    got = parallel.generate(pair.target, pair.draft, PROMPT, 5, tree_size=4, width=2, steps=2,
                            impl="solutions", draft_tree="device")
    assert got.tokens == plain


@pytest.mark.skipif(not runtime.on_gpu(), reason="CUDA graphs and the kernels backend need a GPU")
@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_on_a_gpu_the_graphed_kernels_send_the_host_trees_messages(pair, mode):
    """On a GPU each pass, the selection and the re-root of the device tree are CUDA graphs of the
    Triton kernels (`device_tree_kernels`): the same messages as the host tree's graphed passes."""
    runs = []
    for side_class in (DraftSide, DeviceDraftSide):
        cfg = decoder.settings(6, 3, None, mode=mode)
        draft = side_class(pair.draft, cfg, 2, max_prompt=len(PROMPT), max_new_tokens=20, graphs=True)
        if side_class is DeviceDraftSide:
            assert draft.tree.kernels
        target = TargetSide(pair.target, cfg, max_prompt=len(PROMPT), max_new_tokens=20, graphs=True)
        draft.start(PROMPT, 3)
        target.start(PROMPT, 4)
        clock = Timeline()
        reused, (tokens, accepted) = run_lockstep(draft_rounds(draft, 2, "parallel", clock),
                                                  target_rounds(target, 20, None, clock))
        runs.append((tokens, accepted, reused, draft.calls))
    assert runs[0] == runs[1]
