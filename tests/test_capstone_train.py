"""The capstone's training code path on the CPU, a handful of steps (the real runs are on a GPU:
course/capstone/weights/README.md)."""

from dataclasses import replace

import torch

from course.capstone import train, weights


def test_medium_preset_trains_saves_and_loads(monkeypatch, tmp_path):
    # The medium recipe's models (12-layer target, 1-layer draft) on little text and small batches.
    quick = replace(train.RECIPES["medium"], train_chars=60_000, seq_len=32, batch=2, warmup=1, log_every=1,
                    eval_every=2)
    monkeypatch.setattr(train, "RECIPES", dict(train.RECIPES, medium=quick))
    monkeypatch.setattr(train, "HELDOUT_CHARS", 20_000)
    monkeypatch.setattr(train, "HELDOUT_WINDOWS", 4)
    train.main(["--pair", "medium", "--steps", "3", "--device", "cpu", "--out", str(tmp_path)])
    log = (tmp_path / "train_medium.log").read_text()
    assert "target step     3/3" in log and "summary (medium pair" in log
    for role in ("target", "draft"):
        model = weights.load_model(tmp_path / f"medium_{role}.safetensors", device="cpu")
        assert model.config == weights.CONFIGS["medium"][role]
        meta = weights.read_metadata(tmp_path / f"medium_{role}.safetensors")
        assert meta["role"] == role and float(meta["heldout_loss"]) > 0
        for p in model.parameters():
            assert torch.isfinite(p).all()
    from safetensors import safe_open

    with safe_open(str(tmp_path / "medium_target.safetensors"), framework="pt") as f:  # the store dtype
        assert all(f.get_tensor(k).dtype == torch.float16 for k in f.keys())
    assert sorted(p.name for p in tmp_path.glob("medium_draft_*.safetensors"))  # a snapshot of the draft
