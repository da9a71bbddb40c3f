"""Train a capstone pair (target and draft) on the generated corpus and write its weights.

    python -m course.capstone.train --pair medium|small|tiny [--steps N] [--device cuda|cpu] [--out DIR]

Both models see the same text (course.capstone.text.corpus with a training seed) and are scored on
text from another seed (held out). AdamW with a linear warmup and a cosine decay, fixed seeds, bf16
autocast on a GPU. Writes, into --out (default course/capstone/weights/):
  <pair>_target.safetensors, <pair>_draft.safetensors   (fp16 for medium and small, fp32 for tiny)
  <pair>_draft_<steps>.safetensors                       (the draft earlier in its training)
  train_<pair>.log                                       (this script's output)
The log ends with each model's held-out loss and how often each draft's greedy next token equals the
target's (the quantity speculative decoding lives on).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .model import ModelConfig, TinyLM
from .text import VOCAB, corpus
from .weights import CONFIGS, WEIGHTS_DIR, save_model


@dataclass(frozen=True)
class Recipe:
    """How one pair is trained. steps are the target's; the draft trains for draft_steps."""

    train_chars: int
    seq_len: int
    batch: int
    steps: int
    draft_steps: int
    lr: float
    draft_lr: float
    warmup: int
    log_every: int
    eval_every: int
    snapshot_fractions: tuple[float, ...]
    store_dtype: torch.dtype


RECIPES = {
    # ~9.3 M parameters in all (18 MB in fp16); 64 x 512 tokens a step. Under 2 minutes on one H100
    # (weights/train_medium.log).
    "medium": Recipe(train_chars=24_000_000, seq_len=512, batch=64, steps=2000, draft_steps=2000, lr=1.5e-3,
                     draft_lr=3e-3, warmup=100, log_every=100, eval_every=500,
                     snapshot_fractions=(1 / 40, 1 / 10, 1 / 3), store_dtype=torch.float16),
    # ~4.7 M parameters in all; 64 x 512 tokens a step. Sized for <= 4 minutes on one H100.
    "small": Recipe(train_chars=24_000_000, seq_len=512, batch=64, steps=2500, draft_steps=2000, lr=2e-3,
                    draft_lr=3e-3, warmup=100, log_every=100, eval_every=500,
                    snapshot_fractions=(1 / 40, 1 / 10, 1 / 3), store_dtype=torch.float16),
    # ~60 k parameters; a couple of minutes on two CPU cores.
    "tiny": Recipe(train_chars=1_500_000, seq_len=128, batch=32, steps=800, draft_steps=600, lr=5e-3,
                   draft_lr=5e-3, warmup=40, log_every=50, eval_every=200,
                   snapshot_fractions=(1 / 30, 1 / 10, 1 / 3), store_dtype=torch.float32),
}
TRAIN_SEED, HELDOUT_SEED = 1, 2
HELDOUT_CHARS = 200_000
HELDOUT_WINDOWS = 64


def encode_array(text: str) -> torch.Tensor:
    """The corpus as token ids (uint8 -> int64), via a lookup table (text.encode is per character)."""
    table = np.full(256, 255, dtype=np.uint8)
    for i, ch in enumerate(VOCAB):
        table[ord(ch)] = i
    ids = table[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
    if (ids == 255).any():
        raise ValueError("corpus contains characters outside VOCAB")
    return torch.from_numpy(ids.astype(np.int64))


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup to `peak`, then cosine decay to peak / 10."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


class Logger:
    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, line: str = ""):
        print(line, flush=True)
        self.lines.append(line)


def batches(data: torch.Tensor, seq_len: int, batch: int, gen: torch.Generator):
    """Random windows of seq_len + 1 tokens: inputs and their next-token targets. Drawn where data
    lives (the whole corpus sits on the GPU), so no step waits for a host-to-device copy."""
    offsets = torch.arange(seq_len + 1, device=data.device)
    while True:
        starts = torch.randint(0, data.numel() - seq_len - 1, (batch,), generator=gen, device=data.device)
        idx = starts[:, None] + offsets
        window = data[idx]
        yield window[:, :-1], window[:, 1:]


def heldout_windows(seq_len: int) -> torch.Tensor:
    data = encode_array(corpus(HELDOUT_CHARS, HELDOUT_SEED))
    gen = torch.Generator().manual_seed(HELDOUT_SEED)
    starts = torch.randint(0, data.numel() - seq_len - 1, (HELDOUT_WINDOWS,), generator=gen)
    return data[starts[:, None] + torch.arange(seq_len + 1)]


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@torch.no_grad()
def evaluate(model: TinyLM, windows: torch.Tensor, device: torch.device) -> tuple[float, torch.Tensor]:
    """Mean held-out cross-entropy (nats per character) and the greedy next tokens (W, T)."""
    model.eval()
    losses, greedy = [], []
    for chunk in windows.split(16):
        chunk = chunk.to(device)
        with autocast(device):
            logits = model(chunk[:, :-1]).float()
        losses.append(F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none").cpu())
        greedy.append(logits.argmax(-1).cpu())
    model.train()
    return torch.cat(losses).mean().item(), torch.cat(greedy)


def train_one(role: str, config: ModelConfig, data: torch.Tensor, windows: torch.Tensor, steps: int,
              lr: float, recipe: Recipe, device: torch.device, log: Logger, seed: int,
              snapshots: frozenset[int] = frozenset(), on_snapshot=None) -> TinyLM:
    torch.manual_seed(seed)
    model = TinyLM(config)
    model.reset_parameters(seed)
    model.to(device).train()
    log(f"{role}: {config}  ({model.num_parameters():,} parameters)")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    gen = torch.Generator(device=device).manual_seed(seed)
    stream = batches(data.to(device), recipe.seq_len, recipe.batch, gen)
    tokens_per_step = recipe.batch * recipe.seq_len
    t_start = t_last = time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, recipe.warmup)
        x, y = next(stream)
        with autocast(device):
            logits = model(x, validate=False)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        if done % recipe.log_every == 0 or done == steps:
            if device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            n_steps = recipe.log_every if done % recipe.log_every == 0 else done % recipe.log_every
            rate = n_steps * tokens_per_step / (now - t_last)
            current_lr = lr_at(step, steps, lr, recipe.warmup)
            log(f"{role} step {done:5d}/{steps}  loss {loss.item():.4f}  lr {current_lr:.2e}"
                f"  {rate:,.0f} tok/s  {now - t_start:6.1f} s")
            t_last = now
        if done % recipe.eval_every == 0 or done == steps:
            heldout, _ = evaluate(model, windows, device)
            log(f"{role} step {done:5d}  held-out loss {heldout:.4f}")
            t_last = time.perf_counter()
        if done in snapshots and on_snapshot is not None:
            on_snapshot(done, model)
            t_last = time.perf_counter()
    log(f"{role}: {steps} steps in {time.perf_counter() - t_start:.1f} s")
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m course.capstone.train",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=sorted(RECIPES), required=True)
    parser.add_argument("--steps", type=int, default=None,
                        help="target training steps (the draft's scale along); default: the recipe's")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="default: cuda if available, else cpu")
    parser.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    args = parser.parse_args(argv)

    recipe = RECIPES[args.pair]
    steps, draft_steps = recipe.steps, recipe.draft_steps
    if args.steps is not None:
        if args.steps < 1:
            parser.error("--steps must be >= 1")
        draft_steps = max(1, round(draft_steps * args.steps / steps))
        steps = args.steps
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = True
    log = Logger()
    cmd = "python -m course.capstone.train " + " ".join(sys.argv[1:] if argv is None else argv)
    log(f"$ {cmd}")
    log(f"torch {torch.__version__}, device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else
           f" ({torch.get_num_threads()} threads)"))
    log(f"recipe: {recipe}")
    t0 = time.perf_counter()
    data = encode_array(corpus(recipe.train_chars, TRAIN_SEED))
    windows = heldout_windows(recipe.seq_len)
    log(f"corpus: {data.numel():,} training characters (seed {TRAIN_SEED}), {HELDOUT_WINDOWS} held-out "
        f"windows of {recipe.seq_len} (seed {HELDOUT_SEED}); generated in {time.perf_counter() - t0:.1f} s")
    configs = CONFIGS[args.pair]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    target = train_one("target", configs["target"], data, windows, steps, recipe.lr, recipe, device, log,
                       seed=10)
    target_loss, target_greedy = evaluate(target, windows, device)
    save_model(target, out / f"{args.pair}_target.safetensors", recipe.store_dtype, pair=args.pair,
               role="target", steps=steps, heldout_loss=f"{target_loss:.4f}", command=cmd)

    fractions = recipe.snapshot_fractions
    snapshot_steps = sorted({max(1, round(f * draft_steps)) for f in fractions} - {draft_steps})
    for old in out.glob(f"{args.pair}_draft_*.safetensors"):  # stale snapshots of another --steps
        old.unlink()
    summary = []

    def save_draft(done: int, model: TinyLM, final: bool = False) -> None:
        """Evaluate and store the draft after `done` steps: a snapshot (a worse draft, for the plot of
        acceptance against draft quality) or, final, the pair's draft."""
        loss, greedy = evaluate(model, windows, device)
        agree = (greedy == target_greedy).float().mean().item()
        summary.append((f"draft @ {done} steps" + (" (final)" if final else ""), loss, agree))
        name = f"{args.pair}_draft.safetensors" if final else f"{args.pair}_draft_{done}.safetensors"
        save_model(model, out / name, recipe.store_dtype, pair=args.pair,
                   role="draft" if final else "draft snapshot", steps=done, heldout_loss=f"{loss:.4f}",
                   agreement=f"{agree:.4f}", command=cmd)
        if not final:
            log(f"draft snapshot at step {done}: held-out loss {loss:.4f}, greedy agreement with target "
                f"{agree:.3f}")

    draft = train_one("draft", configs["draft"], data, windows, draft_steps, recipe.draft_lr, recipe, device,
                      log, seed=20, snapshots=frozenset(snapshot_steps), on_snapshot=save_draft)
    save_draft(draft_steps, draft, final=True)

    log("")
    log(f"summary ({args.pair} pair; held-out loss in nats per character; agreement = fraction of held-out "
        f"positions where the draft's greedy next token equals the target's)")
    log(f"  target                         held-out loss {target_loss:.4f}")
    for label, loss, agree in summary:
        log(f"  {label:30s} held-out loss {loss:.4f}  agreement {agree:.3f}")
    size = sum(p.stat().st_size for p in out.glob(f"{args.pair}_*.safetensors"))
    log(f"weights: {size / 1e6:.2f} MB in {out}; total time {time.perf_counter() - t0:.1f} s")
    (out / f"train_{args.pair}.log").write_text("\n".join(log.lines) + "\n")


if __name__ == "__main__":
    main()
