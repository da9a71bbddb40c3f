"""The capstone's models, tokenizer, corpus and committed tiny pair (CPU, a few seconds)."""

import pytest
import torch
import torch.nn.functional as F

from course.capstone import text, weights
from course.capstone.model import KVCache, ModelConfig, TinyLM

GQA = ModelConfig(vocab_size=text.VOCAB_SIZE, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                  max_positions=64)


def make_model(config=GQA, seed=0):
    torch.manual_seed(seed)
    model = TinyLM(config).eval()
    model.reset_parameters(seed)
    # Non-trivial norms, so that a wrongly placed norm would show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn(p.shape))
    return model


def reference_attend(visible):
    """A torch reference `attend`: query (b, w) sees the cache rows where visible[b, w] is True,
    query head h reading KV head h // group, scale 1/sqrt(hd), in float64."""
    def attend(layer, q, k, v):
        k, v = k[:, :, :visible.shape[-1]], v[:, :, :visible.shape[-1]]  # not the scratch row
        group = q.shape[1] // k.shape[1]
        k = k.double().repeat_interleave(group, dim=1)
        v = v.double().repeat_interleave(group, dim=1)
        scores = q.double() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5        # (B, H, W, C)
        scores = scores.masked_fill(~visible[:, None], float("-inf"))
        return (scores.softmax(-1) @ v).to(q.dtype)
    return attend


def causal_visible(rows, capacity):
    """Query (b, w) sees the rows of tokens 0..w of sample b (wherever they were written)."""
    B, W = rows.shape
    visible = torch.zeros(B, W, capacity, dtype=torch.bool)
    for b in range(B):
        for w in range(W):
            visible[b, w, rows[b, :w + 1]] = True
    return visible


def test_step_with_causal_attend_equals_forward():
    model = make_model()
    B, T = 3, 12
    tokens = torch.randint(0, text.VOCAB_SIZE, (B, T), generator=torch.Generator().manual_seed(1))
    ref = model(tokens)
    positions = torch.arange(T).expand(B, T)
    # All at once, rows [0, T) in order.
    cache = model.new_cache(B, 16)
    rows = positions.clone()
    out = model.step(tokens, positions, cache, rows, reference_attend(causal_visible(rows, 16)))
    assert out.dtype == torch.float32 and out.shape == (B, T, text.VOCAB_SIZE)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # Token by token, written at scattered rows (the model must not assume row == position).
    cache = model.new_cache(B, 32)
    rows = torch.stack([torch.randperm(32, generator=torch.Generator().manual_seed(b))[:T] for b in range(B)])
    visible = causal_visible(rows, 32)
    outs = [model.step(tokens[:, t:t + 1], positions[:, t:t + 1], cache, rows[:, t:t + 1],
                       reference_attend(visible[:, t:t + 1])) for t in range(T)]
    torch.testing.assert_close(torch.cat(outs, 1), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_rope_and_swiglu_step_equals_the_torch_statement(dtype):
    """`model_kernels` (the GPU's path) against the torch statement of `step`, in Triton's
    interpreter: several queries per sample, so q/k and gate/up are the strided views the kernels
    replace."""
    import course  # noqa: F401  (the interpreter, before triton runs)
    from course.core import runtime

    device = runtime.torch_device()  # the kernels need the GPU's tensors there
    model = make_model().to(device=device, dtype=dtype)
    B, W = 2, 5
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, text.VOCAB_SIZE, (B, W), generator=gen).to(device)
    positions = torch.randint(0, 60, (B, W), generator=gen).to(device)
    rows = torch.stack([torch.randperm(16, generator=gen)[:W] for _ in range(B)]).to(device)
    visible = torch.rand((B, W, 16), generator=gen) < 0.5
    visible[..., 0] = True
    visible = visible.to(device)
    logits = {}
    for fused in (False, True):
        model.fused_elementwise = fused
        logits[fused] = model.step(tokens, positions, model.new_cache(B, 16), rows, reference_attend(visible))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(logits[True], logits[False], atol=tolerance, rtol=tolerance)


def test_cache_views_and_writes():
    model = make_model()
    B, W, C = 2, 4, 10
    cache = model.new_cache(B, C)
    assert isinstance(cache, KVCache) and cache.capacity == C
    assert cache.data.shape == (B, GQA.n_layers * 2 * GQA.n_kv_heads, C + 1, GQA.head_dim)  # + scratch
    hkv = GQA.n_kv_heads
    for layer in range(GQA.n_layers):  # views into the one tensor, at the contract's channels
        assert cache.k(layer).data_ptr() == cache.data[:, 2 * layer * hkv].data_ptr()
        assert cache.v(layer).data_ptr() == cache.data[:, (2 * layer + 1) * hkv].data_ptr()
        assert cache.k(layer).shape == (B, hkv, C + 1, GQA.head_dim)
    tokens = torch.randint(0, text.VOCAB_SIZE, (B, W), generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([[5, 6, 7, 8], [0, 1, 2, 0]])
    rows = torch.tensor([[2, 9, -1, 4], [0, 1, 3, -1]])  # -1: padding, not written
    seen = {}

    def attend(layer, q, k, v):
        seen.setdefault("calls", []).append((layer, k.data_ptr(), v.data_ptr()))
        return torch.zeros(q.shape, dtype=q.dtype)

    model.step(tokens, positions, cache, rows, attend)
    assert seen["calls"] == [(i, cache.k(i).data_ptr(), cache.v(i).data_ptr()) for i in range(GQA.n_layers)]
    written = cache.data[:, :, :C].abs().sum(dim=(1, 3)) > 0                  # (B, C): padding went to row C
    expected = torch.zeros(B, C, dtype=torch.bool)
    expected[0, [2, 9, 4]] = True
    expected[1, [0, 1, 3]] = True
    assert torch.equal(written, expected)
    # Layer 0's keys are the first block's rotated keys of the embeddings: check one row exactly.
    block = model.blocks[0]
    _, k0, v0 = block.attn.qkv(block.attn_norm(model.embed(tokens)), positions)
    torch.testing.assert_close(cache.k(0)[0, :, 9], k0[0, :, 1])
    torch.testing.assert_close(cache.v(0)[1, :, 3], v0[1, :, 2])


def test_step_refuses_bad_input():
    model = make_model()
    cache = model.new_cache(1, 4)
    tokens = torch.zeros(1, 2, dtype=torch.long)
    pos = torch.tensor([[0, 1]])
    attend = reference_attend(torch.ones(1, 2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="rows"):
        model.step(tokens, pos, cache, torch.tensor([[0, 4]]), attend)
    with pytest.raises(ValueError, match="positions"):
        model.step(tokens, torch.tensor([[0, 64]]), cache, pos, attend)
    with pytest.raises(ValueError, match="tokens"):
        model.step(tokens + text.VOCAB_SIZE, pos, cache, pos, attend)
    with pytest.raises(ValueError, match="attend"):
        model.step(tokens, pos, cache, pos, lambda layer, q, k, v: q[:, :, :1])
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelConfig(vocab_size=80, d_model=64, n_layers=1, n_heads=4, n_kv_heads=3, max_positions=8)


def test_tokenizer_round_trip_and_refusals():
    sample = text.corpus(5000, seed=7)
    assert len(sample) == 5000 and sample == text.corpus(5000, seed=7) != text.corpus(5000, seed=8)
    ids = text.encode(sample)
    assert all(0 <= i < text.VOCAB_SIZE for i in ids) and text.decode(ids) == sample
    assert text.decode(torch.tensor(ids[:50])) == sample[:50]
    assert text.VOCAB_SIZE % 16 == 0 and len(set(text.VOCAB)) == text.VOCAB_SIZE
    with pytest.raises(ValueError, match="text contains 'é' at position 3"):
        text.encode("abcé")
    with pytest.raises(ValueError, match="tokens"):
        text.decode([1, text.VOCAB_SIZE])
    # The corpus has the structure it claims: arithmetic lines are correct sums.
    sums = [line for line in text.corpus(50_000, seed=3).split("\n")[:-1] if " + " in line and "=" in line]
    assert sums
    for line in sums:
        left, right = line.rstrip(".").split(" = ")
        a, b = left.split(" + ")
        assert int(a) + int(b) == int(right)


def test_tiny_pair_loads_and_draft_agrees_with_target():
    pair = weights.load_pair("tiny", device="cpu")
    assert pair.name == "tiny"
    assert pair.target.config == weights.CONFIGS["tiny"]["target"]
    assert pair.draft.config == weights.CONFIGS["tiny"]["draft"]
    assert pair.target.dtype == torch.float32 and not pair.target.training
    held_out = torch.tensor(text.encode(text.corpus(16 * 64, seed=12345))).view(16, 64)
    target_logits, draft_logits = pair.target(held_out), pair.draft(held_out)
    # The target has learned the text: much better than a uniform guess (ln 80 = 4.38 nats).
    loss = F.cross_entropy(target_logits[:, :-1].transpose(1, 2), held_out[:, 1:]).item()
    assert loss < 2.0
    agreement = (target_logits.argmax(-1) == draft_logits.argmax(-1)).float().mean().item()
    assert 0.5 < agreement < 1.0, agreement
    drafts = weights.load_drafts("tiny", device="cpu")
    assert len(drafts) >= 3 and drafts[-1][0].endswith("(final)")
    rates = [(target_logits.argmax(-1) == d(held_out).argmax(-1)).float().mean().item() for _, d in drafts]
    assert rates[0] < rates[-1], rates  # the snapshots are of increasing quality


def test_missing_weights_name_the_training_command(monkeypatch, tmp_path):
    monkeypatch.setattr(weights, "WEIGHTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="python -m course.capstone.train --pair small"):
        weights.load_pair("small")
    with pytest.raises(ValueError, match="name"):
        weights.load_pair("huge")
