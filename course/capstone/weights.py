"""The capstone's trained pairs: their configurations, and loading them from safetensors.

Files live in course/capstone/weights/: <pair>_target.safetensors, <pair>_draft.safetensors and
draft snapshots <pair>_draft_<steps>.safetensors (the same draft earlier in its training, for the
plot of acceptance against draft quality). Each file's metadata holds its ModelConfig as JSON, so a
file describes itself. `python -m course.capstone.train --pair <pair>` writes them (see
weights/README.md for the exact commands and train_<pair>.log for their logs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .model import ModelConfig, TinyLM
from .text import VOCAB_SIZE

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"

# The pairs. "medium": a 12-layer target and a 1-layer draft, trained on a GPU in a few minutes: as
# with real model pairs, one target step costs several draft steps, which is what speculation lives
# on; used for the speed measurements. "small": an earlier 4-layer target (a target step costs about
# as much as a draft step there, so speculation cannot pay). "tiny": small enough for the Triton
# interpreter and the Numba simulator (CI), trained on a CPU.
CONFIGS: dict[str, dict[str, ModelConfig]] = {
    "medium": {
        "target": ModelConfig(vocab_size=VOCAB_SIZE, d_model=256, n_layers=12, n_heads=8, n_kv_heads=2,
                              max_positions=512, ff_mult=3),
        "draft": ModelConfig(vocab_size=VOCAB_SIZE, d_model=128, n_layers=1, n_heads=4, n_kv_heads=1,
                             max_positions=512),
    },
    "small": {
        "target": ModelConfig(vocab_size=VOCAB_SIZE, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2,
                              max_positions=512),
        "draft": ModelConfig(vocab_size=VOCAB_SIZE, d_model=128, n_layers=1, n_heads=4, n_kv_heads=1,
                             max_positions=512),
    },
    "tiny": {
        "target": ModelConfig(vocab_size=VOCAB_SIZE, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                              max_positions=128),
        "draft": ModelConfig(vocab_size=VOCAB_SIZE, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                             max_positions=128),
    },
}
PAIRS = tuple(CONFIGS)


@dataclass
class Pair:
    """A trained target and its draft (same tokenizer: course.capstone.text)."""

    target: TinyLM
    draft: TinyLM
    name: str


def train_command(name: str) -> str:
    device = "cpu" if name == "tiny" else "cuda"
    return f"python -m course.capstone.train --pair {name} --device {device}"


def _check_name(name) -> str:
    if name not in CONFIGS:
        raise ValueError(f"name must be one of {list(PAIRS)}, got {name!r}")
    return name


def weight_path(name: str, role: str) -> Path:
    """weights/<name>_<role>.safetensors; role "target", "draft" or "draft_<steps>"."""
    return WEIGHTS_DIR / f"{_check_name(name)}_{role}.safetensors"


def _missing(path: Path, name: str) -> FileNotFoundError:
    return FileNotFoundError(f"{path} does not exist: the '{name}' pair has not been trained here. Train it "
                             f"from the repository root with:\n    {train_command(name)}\n(see "
                             f"{WEIGHTS_DIR / 'README.md'})")


def save_model(model: TinyLM, path: Path, dtype: torch.dtype, **metadata) -> None:
    """Write model's weights in `dtype` with its config (and any string metadata) to safetensors."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    meta = {"config": json.dumps(model.config.to_dict())} | {k: str(v) for k, v in metadata.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)
    path.chmod(0o644)  # safetensors writes through a private temporary file (mode 600)


def read_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def load_model(path: Path, device=None, dtype=None) -> TinyLM:
    """A TinyLM from one safetensors file, in eval mode without gradients, on `device` (default: the
    course's torch device: cuda on a GPU, cpu in the simulator) in `dtype` (default float32)."""
    from safetensors.torch import load_file

    from course.core.runtime import torch_device

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    meta = read_metadata(path)
    if "config" not in meta:
        raise ValueError(f"{path} has no 'config' metadata: not written by course.capstone.train")
    model = TinyLM(ModelConfig(**json.loads(meta["config"])))
    model.load_state_dict(load_file(str(path)), strict=True)
    model.to(device=device if device is not None else torch_device(),
             dtype=dtype if dtype is not None else torch.float32)
    return model.eval().requires_grad_(False)


def load_pair(name: str, device=None, dtype=None) -> Pair:
    """The trained target and draft of pair `name` (see CONFIGS); see `load_model` for device
    and dtype. FileNotFoundError naming the training command if the weights are missing."""
    _check_name(name)
    models = {}
    for role in ("target", "draft"):
        path = weight_path(name, role)
        if not path.exists():
            raise _missing(path, name)
        models[role] = load_model(path, device, dtype)
    return Pair(target=models["target"], draft=models["draft"], name=name)


def snapshot_steps(name: str) -> list[int]:
    """Training steps of the committed draft snapshots of pair `name`, ascending."""
    found = []
    for path in WEIGHTS_DIR.glob(f"{_check_name(name)}_draft_*.safetensors"):
        match = re.fullmatch(rf"{name}_draft_(\d+)\.safetensors", path.name)
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def load_drafts(name: str, device=None, dtype=None) -> list[tuple[str, TinyLM]]:
    """(label, draft) of increasing quality: the snapshots taken during the draft's training, then
    the final draft. Labels say the training steps ("30 steps", ..., "600 steps (final)")."""
    final_path = weight_path(name, "draft")
    if not final_path.exists():
        raise _missing(final_path, name)
    drafts = [(f"{s} steps", load_model(weight_path(name, f"draft_{s}"), device, dtype))
              for s in snapshot_steps(name)]
    final_steps = read_metadata(final_path).get("steps", "?")
    drafts.append((f"{final_steps} steps (final)", load_model(final_path, device, dtype)))
    return drafts
