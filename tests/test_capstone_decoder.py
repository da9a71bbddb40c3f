"""The capstone decoder (notebook 19) with the tiny pair on the CPU: greedy equality with the target's
own greedy decoding, the sampled tokens' distribution, kernels against reference, fused bookkeeping
against its torch statement, rounds that never wait for the host, bad input. (The draft trees' shape
and intervals: tests/fuzz/test_fuzz_course.py.)"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import course  # noqa: F401  (first: chooses the simulator / interpreter)
from course.capstone import decoder
from course.capstone.model import ModelConfig, TinyLM
from course.capstone.text import encode
from course.capstone.weights import load_pair
from course.core import runtime
from course.measure.stats import chi_square_p_value

PROMPTS = ["The old fox ", "12 + 7 = ", "On 3 May 1950, the"]


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny", device=runtime.torch_device(), dtype=torch.float32)


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    """The target's own greedy continuation: plain full-sequence forward passes, no cache, no kernels."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model(torch.tensor([seq], device=model.device))[0, -1].argmax()))
    return seq[len(prompt):]


def test_greedy_kernels_equal_target_greedy(pair):
    prompts = [encode(PROMPTS[0]), encode(PROMPTS[1])]
    want = [greedy_reference(pair.target, p, 5) for p in prompts]
    tree = decoder.speculative(pair.target, pair.draft, prompts, 5, tree_size=4, width=2, backend="kernels",
                               impl="solutions")
    chain = decoder.speculative(pair.target, pair.draft, prompts, 5, tree_size=3, width=1, branch=1,
                                backend="kernels", impl="solutions")
    plain = decoder.autoregressive(pair.target, prompts, 5, backend="kernels", impl="solutions")
    assert tree.tokens == chain.tokens == plain.tokens == want
    assert tree.target_calls < 5 and chain.target_calls < 5 and plain.target_calls == 5


# (8, 8, 4): a step offers fewer nodes than w (a fresh root has 4 children), so steps run fewer.
@pytest.mark.parametrize("tree_size, width, branch, steps", [(6, 2, 4, None), (3, 1, 2, None), (8, 4, 3, 3),
                                                            (8, 8, 4, 2), (5, 1, 1, None), (12, 2, 2, 6)])
def test_greedy_reference_equals_target_greedy(pair, tree_size, width, branch, steps):
    prompts = [encode(p) for p in PROMPTS]
    n = 24
    got = decoder.speculative(pair.target, pair.draft, prompts, n, tree_size=tree_size, width=width,
                              branch=branch, steps=steps, backend="reference")
    want = [greedy_reference(pair.target, p, n) for p in prompts]
    assert got.tokens == want
    plain = decoder.autoregressive(pair.target, prompts, n, backend="reference")
    assert plain.tokens == want and plain.target_calls == n
    assert got.target_calls < n  # the draft does get tokens accepted
    assert got.accepted_per_call > 0
    assert got.draft_calls == got.target_calls * decoder.settings(tree_size, width, branch, steps).steps


@pytest.mark.parametrize("bookkeeping", ["torch", "fused"])
def test_eos_and_lengths(pair, bookkeeping):
    prompts = [encode("The"), encode("12 + 7 = ")]
    free = decoder.speculative(pair.target, pair.draft, prompts, 10, backend="reference")
    eos = free.tokens[0][3]
    for method in (lambda **kw: decoder.speculative(pair.target, pair.draft, prompts, 10, **kw),
                   lambda **kw: decoder.autoregressive(pair.target, prompts, 10, **kw)):
        stopped = method(backend="reference", eos=eos, bookkeeping=bookkeeping)
        for full, cut in zip(free.tokens, stopped.tokens, strict=True):
            end = full.index(eos) + 1 if eos in full else len(full)
            assert cut == full[:end]


def test_a_decoder_serves_many_generations(pair):
    """Built once (buffers, and graphs on a GPU), reused with other prompts and lengths."""
    built = decoder.SpeculativeDecoder(pair.target, pair.draft, batch=2, max_len=40, tree_size=5, width=2,
                                       backend="reference")
    for texts, n in ((PROMPTS[:2], 6), (PROMPTS[1:], 12)):
        prompts = [encode(t) for t in texts]
        assert built.generate(prompts, n).tokens == [greedy_reference(pair.target, p, n) for p in prompts]


def test_sampling_matches_target_distribution(pair):
    """Many runs of sampling mode on one prompt (a batch of copies, each with its own uniforms): the
    first and second emitted tokens follow the target's distributions (SpecInfer §4.3)."""
    prompt = encode("The old ")
    runs = 400
    got = decoder.speculative(pair.target, pair.draft, [prompt] * runs, 2, tree_size=4, width=2, branch=2,
                              mode="sample", seed=11, backend="reference")
    assert got.accepted_per_call > 0.2  # drafts are accepted: the test exercises the tree walk
    first = torch.tensor([t[0] for t in got.tokens])
    second = torch.tensor([t[1] for t in got.tokens])
    vocab = pair.target.config.vocab_size
    with torch.no_grad():
        device = pair.target.device
        p1 = torch.softmax(pair.target(torch.tensor([prompt], device=device))[0, -1].double(), -1).cpu()
        seqs = torch.tensor([prompt + [x] for x in range(vocab)], device=device)
        p2_given = torch.softmax(pair.target(seqs)[:, -1].double(), -1).cpu()
    p2 = p1 @ p2_given
    assert chi_square_p_value(torch.bincount(first, minlength=vocab), p1, pool_below=5) > 1e-3
    assert chi_square_p_value(torch.bincount(second, minlength=vocab), p2, pool_below=5) > 1e-3
    # and a wrong distribution is rejected: the test has power
    assert chi_square_p_value(torch.bincount(second, minlength=vocab), p1, pool_below=5) < 1e-3


def test_sampling_kernels_agree_with_reference(pair):
    prompts = [encode(PROMPTS[0]), encode(PROMPTS[2])]
    runs = {backend: decoder.speculative(pair.target, pair.draft, prompts, 4, tree_size=4, width=2,
                                         mode="sample", seed=5, backend=backend, impl="solutions")
            for backend in ("reference", "kernels")}
    assert runs["kernels"].tokens == runs["reference"].tokens
    assert runs["kernels"].accepted == runs["reference"].accepted
    plain = {backend: decoder.autoregressive(pair.target, prompts, 3, mode="sample", seed=5, backend=backend,
                                             impl="solutions") for backend in ("reference", "kernels")}
    assert plain["kernels"].tokens == plain["reference"].tokens


# --------------------------------------------------------------------------- fused bookkeeping


STATE = ("prefix", "prefix32", "root", "n_out", "done", "out", "counter", "status", "lag", "lag_token",
         "chosen", "v_parents", "v_tokens", "d_kv_start", "d_kv_end", "local")


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_fused_bookkeeping_equals_its_torch_statement(pair, mode):
    """Round by round, every buffer the bookkeeping writes is the same whether the Triton kernels
    (course.capstone.kernels) or the torch statement wrote it (same attention: the reference's)."""
    prompts = [encode(PROMPTS[0]), encode(PROMPTS[2])]
    built = {book: decoder.SpeculativeDecoder(pair.target, pair.draft, batch=2, max_len=40, tree_size=5,
                                              width=2, branch=3, steps=3, mode=mode, backend="reference",
                                              bookkeeping=book)
             for book in ("torch", "fused")}
    for one in built.values():
        one._prefill_all(prompts)
        one.start(prompts, 12, eos=None, seed=4)
    for _ in range(3):
        for one in built.values():
            one.round()
        torch_, fused = built["torch"], built["fused"]
        for name in STATE:
            a, b = getattr(torch_, name), getattr(fused, name)
            if name == "out":  # not its last column, scratch for writes that are dropped
                a, b = a[:, :-1], b[:, :-1]
            assert torch.equal(a, b), name
        assert torch.equal(torch_.tree.table, fused.tree.table)
        for name in ("target", "draft"):
            for a, b in zip(torch_.moves[name][:3], fused.moves[name][:3], strict=True):
                assert torch.equal(a, b), name
        for a, b in zip(torch_.step_inputs, fused.step_inputs, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(vars(a).values(), vars(b).values(), strict=True))
    plain = {book: decoder.autoregressive(pair.target, prompts, 5, mode=mode, seed=4, backend="reference",
                                          bookkeeping=book).tokens for book in ("torch", "fused")}
    assert plain["torch"] == plain["fused"]


def test_the_bookkeeping_state_is_the_decoders_own_buffers(pair):
    """The state passed to the bookkeeping names the decoder's buffers, the same tensors (what a CUDA
    graph captured over them needs), and cannot be pointed at others; the classes that run are chosen
    in one place."""
    import dataclasses

    from course.capstone.bookkeeping import FusedBookkeeping, TorchBookkeeping

    spec = decoder.SpeculativeDecoder(pair.target, pair.draft, batch=2, max_len=30, tree_size=5, width=2,
                                      branch=3, steps=3, mode="sample", backend="reference")
    plain = decoder.PlainDecoder(pair.target, batch=2, max_len=30, mode="sample", backend="reference")
    for built, progress in ((spec, spec.state.progress), (plain, plain.state)):
        for name in ("prefix", "prefix32", "root", "n_out", "done", "limit", "eos", "out", "counter",
                     "status", "uniforms"):
            assert getattr(progress, name) is getattr(built, name), name
    s = spec.state
    for name, own in (("draft_kv_start", "d_kv_start"), ("draft_kv_end", "d_kv_end"), ("chosen", "chosen"),
                      ("path", "path"), ("next_token", "next_token"), ("verify_parents", "v_parents"),
                      ("verify_tokens", "v_tokens"), ("lag", "lag"), ("local", "local"), ("tree", "tree")):
        assert getattr(s, name) is getattr(spec, own), name
    assert s.draft_inputs is spec.step_inputs and s.target_index is spec.t_index
    for name, moves in s.moves.items():
        assert (moves.src, moves.dst, moves.counts) == spec.moves[name][:3]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.progress.prefix = torch.zeros(2, dtype=torch.int64)
    assert isinstance(decoder.implementations("reference", None, None)[1], TorchBookkeeping)
    assert isinstance(decoder.implementations("kernels", None, "solutions")[1], FusedBookkeeping)
    with pytest.raises(ValueError, match="bookkeeping must be one of"):
        decoder.implementations("reference", "numpy", None)


# --------------------------------------------------------------------------- no waiting for the host

# Operations that make the host wait for the device (a value read back, an output whose size depends
# on values) or copy host data to it: none may run inside a CUDA graph's capture.
WAITING_OPS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "masked_scatter", "is_nonzero",
               "equal", "lift_fresh", "lift_fresh_copy", "_unique2", "unique_consecutive", "unique_dim",
               "repeat_interleave", "allclose"}


class NoHostWaits(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        bool_index = name.startswith("index") and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool
            for t in (args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()))
        if name in WAITING_OPS or bool_index:
            raise AssertionError(f"{func} waits for the host (or copies from it) inside a round")
        return func(*args, **(kwargs or {}))


def test_the_detector_sees_what_waits():
    x = torch.arange(4)
    for wait in (lambda: x.sum().item(), lambda: x[x > 1], lambda: torch.tensor([1, 2]),
                 lambda: bool(x.any())):
        with pytest.raises(AssertionError, match="waits for the host"), NoHostWaits():
            wait()


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_rounds_never_wait_for_the_host(pair, mode):
    """Every phase that a GPU captures as a graph, run under a detector of host waits (the reference
    backend: its operations are torch's; the kernels' launchers only launch)."""
    prompts = [encode(p) for p in PROMPTS]
    spec = decoder.SpeculativeDecoder(pair.target, pair.draft, batch=3, max_len=40, tree_size=6, width=2,
                                      branch=3, mode=mode, backend="reference")
    plain = decoder.PlainDecoder(pair.target, batch=3, max_len=40, mode=mode, backend="reference")
    spec.generate(prompts, 4)
    plain.generate(prompts, 4)
    spec.start(prompts, 8)
    plain.start(prompts, 8)
    with NoHostWaits():
        for _ in range(2):
            spec.round()
            plain.step()


# --------------------------------------------------------------------------- compaction


def test_compaction_of_moves_rewritten_between_launches():
    """prepare_compact_buffers launches whatever the buffers hold at the time, moves with
    dst == src included: equal to the gather-then-scatter reference."""
    from course.capstone.backends import KernelBackend, ReferenceBackend
    from course.capstone.model import KVCache

    device = runtime.torch_device()
    data = torch.randn((2, 2, 12, 16), generator=torch.Generator().manual_seed(0)).to(device)
    int32 = dict(dtype=torch.int32, device=device)
    caches = [KVCache(data.clone(), 1, 1) for _ in range(2)]
    buffers = [(torch.zeros((2, 4), **int32), torch.zeros((2, 4), **int32), torch.zeros(2, **int32))
               for _ in caches]
    moves = [backend.compactor(cache, *bufs) for backend, cache, bufs in
             zip((KernelBackend("solutions"), ReferenceBackend()), caches, buffers, strict=True)]
    for src, dst, counts in ([[5, 6, 9, 0], [3, 4, 0, 0]], [[4, 5, 7, 0], [3, 3, 0, 0]], [3, 1]), \
                            ([[2, 4, 7, 8], [1, 0, 0, 0]], [[2, 3, 4, 5], [1, 0, 0, 0]], [4, 1]):
        for (s, t, c), move in zip(buffers, moves, strict=True):
            s.copy_(torch.tensor(src))
            t.copy_(torch.tensor(dst))
            c.copy_(torch.tensor(counts))
            move()
        torch.testing.assert_close(caches[0].data, caches[1].data, rtol=0, atol=0)
    assert not torch.equal(caches[0].data, data)


# --------------------------------------------------------------------------- bad input


def test_bad_input(pair):
    t, d = pair.target, pair.draft
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        decoder.generate_text(t, d, ["ok", ""], 4, backend="reference")
    with pytest.raises(ValueError, match=r"prompts\[0\] is empty"):
        decoder.speculative(t, d, [[]], 4, backend="reference")
    with pytest.raises(ValueError, match="not in the capstone's alphabet"):
        decoder.generate_text(t, d, "caf\u00e9", 4, backend="reference")
    with pytest.raises(ValueError, match="tree_size must be a positive int"):
        decoder.speculative(t, d, [encode("a")], 4, tree_size=0, backend="reference")
    with pytest.raises(ValueError, match="width = 5 must be <= tree_size = 4"):
        decoder.speculative(t, d, [encode("a")], 4, tree_size=4, width=5, backend="reference")
    with pytest.raises(ValueError, match="tree_size = 9 is more than the 5 nodes"):
        decoder.speculative(t, d, [encode("a")], 4, tree_size=9, width=1, branch=1, steps=4,
                            backend="reference")
    with pytest.raises(ValueError, match="steps = 40 with branch = 4"):
        decoder.settings(tree_size=8, width=2, steps=40)
    with pytest.raises(ValueError, match="mode must be one of"):
        decoder.speculative(t, d, [encode("a")], 4, mode="beam", backend="reference")
    with pytest.raises(ValueError, match="backend must be one of"):
        decoder.speculative(t, d, [encode("a")], 4, backend="cuda")
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        decoder.autoregressive(t, [encode("a")], 0, backend="reference")
    with pytest.raises(ValueError, match=r"prompts\[0\]\[1\] = 999 is not a token id"):
        decoder.speculative(t, d, [[1, 999]], 4, backend="reference")
    with pytest.raises(ValueError, match="max_positions"):
        decoder.speculative(t, d, [encode("a" * 100)], 40, backend="reference")
    if runtime.SIMULATOR:
        with pytest.raises(ValueError, match="graphs=True needs CUDA models on a GPU"):
            decoder.autoregressive(t, [encode("a")], 2, backend="reference", graphs=True)
    other = TinyLM(ModelConfig(vocab_size=96, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                               max_positions=128)).to(t.device)
    with pytest.raises(ValueError, match="draft must share the target's vocabulary: the target has 80"):
        decoder.speculative(t, other, [encode("a")], 4, backend="reference")


def test_a_built_decoder_refuses_what_it_was_not_built_for(pair):
    built = decoder.SpeculativeDecoder(pair.target, pair.draft, batch=1, max_len=20, tree_size=4, width=2,
                                       backend="reference")
    with pytest.raises(ValueError, match="tree_size = 16: this decoder's buffers and graphs were built for "
                                         "tree_size = 4"):
        built.generate([encode("The ")], 4, tree_size=16)
    with pytest.raises(ValueError, match="mode = 'sample'"):
        built.generate([encode("The ")], 4, mode="sample")
    with pytest.raises(ValueError, match=r"prompts\[0\] has 30 tokens: with max_new_tokens = 4 that is 34 "
                                         r"cache rows, more than this decoder's max_len = 20"):
        built.generate([encode("a" * 30)], 4)
    with pytest.raises(ValueError, match="prompts holds 2 prompts; this decoder was built for batch = 1"):
        built.generate([encode("a"), encode("b")], 4)
    with pytest.raises(ValueError, match="max_len = 200"):
        decoder.PlainDecoder(pair.target, batch=1, max_len=200, backend="reference")


def test_generate_command(capsys):
    from course.__main__ import main

    assert main(["generate", "--prompt", "The old ", "--pair", "tiny", "--max-new-tokens", "4", "--backend",
                 "reference", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "accepted per target call" in out and "greedy outputs identical: True" in out
    assert main(["generate", "--prompt", "caf\u00e9", "--pair", "tiny", "--backend", "reference"]) == 2
    assert "not in the capstone's alphabet" in capsys.readouterr().err
    assert main(["generate", "--prompt", "a", "--pair", "tiny", "--tree-size", "2", "--width", "3"]) == 2
