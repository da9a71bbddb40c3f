"""Fuzzing the kernels' launchers (solutions/) with malformed inputs, by hypothesis, seeded.

Every target builds a small valid call from drawn sizes and seeds, then corrupts ONE argument in one
of the ways the course promises to refuse: a wrong dtype, rank or device, an empty tensor, NaN or
inf, a malformed tree (two roots, a cycle, an id out of range, a parent after its child), DFS times
out of range, token ids outside the vocabulary, probability rows that are negative or do not sum to
one, uniforms outside [0, 1), KV positions or moves out of range. Required: a ValueError or
TypeError whose message names the corrupted argument, and every tensor passed in unchanged, bit for
bit. Two corruptions are allowed to be accepted -- a non-contiguous view and a Python list in place
of a tensor -- but then the result must equal the valid call's, bit for bit (never a silently
different answer). The simulator runs a few examples per target; on a GPU (COURSE_SIM=0) more, and
the tensors live on the GPU.

LAUNCHERS is the one table of launcher names: a rename of a launcher is a one-line change there.
"""

from __future__ import annotations

import functools
import importlib
import random
import signal
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.core import inputs, runtime
from course.core.impl import load
from course.topics.kvcache import check as emssd_checks
from course.topics.kvcache import check as swiftspec_checks

DEVICE = runtime.torch_device()
OTHER_DEVICE = "meta"  # neither the simulator's CPU nor a GPU
SIM = runtime.SIMULATOR

# target name -> (module in solutions/, launcher name)
LAUNCHERS = {
    "trees.dfs_times": ("trees", "dfs_times"),
    "trees.tree_mask": ("trees", "tree_mask"),
    "trees.tree_bitmask": ("trees", "tree_bitmask"),
    "attention.flash_attention": ("attention", "flash_attention"),
    "attention.merge_attention": ("attention", "merge_attention"),
    "attention.online_softmax": ("attention", "online_softmax"),
    **{
        f"ladder_{rung}.tree_attention": (f"ladder_{rung}", "tree_attention")
        for rung in ("k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9", "k10", "k11", "dense")
    },
    "ladder_dense.tree_attention_dense": ("ladder_dense", "tree_attention_dense"),
    "triton_attention.tree_attention": ("triton_attention", "tree_attention"),
    "deft.node_groups": ("deft", "node_groups"),
    "deft.flatten_blocks": ("deft", "flatten_blocks"),
    "deft.deft_node_attention": ("deft", "deft_node_attention"),
    "deft.deft_flatten_attention": ("deft", "deft_flatten_attention"),
    "emssd.unpadded_attention": ("emssd", "unpadded_attention"),
    "emssd.padded_attention": ("emssd", "padded_attention"),
    "spec_sampling.speculative_sampling": ("spec_sampling", "speculative_sampling"),
    "spec_sampling.sigmoid_speculative_sampling": ("spec_sampling", "sigmoid_speculative_sampling"),
    "spec_sampling.tile_pass": ("spec_sampling", "tile_pass"),
    "swiftspec.compact": ("swiftspec", "compact"),
    "swiftspec.naive_compact": ("swiftspec", "naive_compact"),
    "swiftspec.tree_cache_attention": ("swiftspec", "tree_cache_attention"),
    "tree_verification.tree_speculative_sampling": ("tree_verification", "tree_speculative_sampling"),
    "tree_verification.greedy_tree_verification": ("tree_verification", "greedy_tree_verification"),
    "tree_verification.parents_from_times": ("tree_verification", "parents_from_times"),
    "tree_verification.target_argmax": ("tree_verification", "target_argmax"),
}

ROOM_BASELINES = ("emssd.padded_attention", "swiftspec.naive_compact")


# Launchers in a topic's room, beside the student's module: target -> (room, whether the room's
# function takes the module's kernels as its first argument).
IN_ROOMS = {"spec_sampling.sigmoid_speculative_sampling": ("course.topics.sampling.launch", True),
            "tree_verification.parents_from_times": ("course.topics.verification.launch", False),
            "tree_verification.target_argmax": ("course.topics.verification.launch", False)}


def launcher(target: str) -> Callable:
    module, name = LAUNCHERS[target]
    if target in ROOM_BASELINES:  # the kvcache room's, not the student module's
        return getattr(importlib.import_module("course.topics.kvcache.baselines"), name)
    if target in IN_ROOMS:
        room, takes_kernels = IN_ROOMS[target]
        function = getattr(importlib.import_module(room), name)
        return functools.partial(function, load(module, "solutions")) if takes_kernels else function
    return getattr(load(module, "solutions"), name)


# --------------------------------------------------------------------------- valid calls


@dataclass
class Call:
    """A valid call: make() returns fresh keyword arguments (the same values every time); kinds
    names each argument's kind (which corruptions apply); names: what a message may call it."""

    make: Callable[[], dict]
    kinds: dict[str, str]
    names: dict[str, tuple[str, ...]]
    skip: tuple[str, ...] = ()  # corruptions that are legitimate input here


def _tree(n: int, seed: int) -> list[int]:
    return inputs.random_tree(n, random.Random(seed), max_children=3)


def _rand(shape, seed, dtype=torch.float32):
    return inputs.random_tensor(shape, seed, dtype, DEVICE)


def _probs(shape, seed, zero_every: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(shape, generator=g, dtype=torch.float64) + 0.05
    if zero_every:
        w[..., ::zero_every] = 0.0
    return (w / w.sum(-1, keepdim=True)).float().to(DEVICE)


def _uniforms(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * 0.999).to(DEVICE)


def _times(trees):
    return inputs.dfs_times_tensors(trees, DEVICE)


# Notebook 02's functions are plain PyTorch: any leading dimensions and any device are fine.
PYTORCH_ANY_SHAPE = ("extra dim", "other device")


def build(target: str, draw) -> Call:
    seed = draw(st.integers(0, 2**16))
    fn_module = LAUNCHERS[target][0]
    n = draw(st.integers(1, 8))
    batch = draw(st.integers(1, 2))
    trees = [_tree(n, seed + b) for b in range(batch)]
    if target.startswith("trees."):
        if target == "trees.dfs_times":
            return Call(lambda: {"parents": inputs.batch_of_trees(trees, DEVICE)}, {"parents": "parents"}, {})
        return Call(
            lambda: dict(zip(("start", "end"), _times(trees), strict=True)),
            {"start": "times", "end": "times"},
            {},
        )
    if target == "attention.flash_attention":
        m = draw(st.integers(1, 8))
        return Call(
            lambda: {
                "q": _rand((2, n, 8), seed),
                "k": _rand((2, m, 8), seed + 1),
                "v": _rand((2, m, 8), seed + 2),
                "mask": torch.ones((2, n, m), dtype=torch.bool, device=DEVICE),
            },
            {"q": "float", "k": "float", "v": "float", "mask": "mask"},
            {},
            PYTORCH_ANY_SHAPE,
        )
    if target == "attention.merge_attention":
        return Call(
            lambda: {
                "out_a": _rand((3, 8), seed),
                "lse_a": _rand((3,), seed + 1),
                "out_b": _rand((3, 8), seed + 2),
                "lse_b": _rand((3,), seed + 3),
            },
            {"out_a": "float", "lse_a": "lse", "out_b": "float", "lse_b": "lse"},
            {},
            PYTORCH_ANY_SHAPE,
        )
    if target == "attention.online_softmax":
        return Call(lambda: {"x": _rand((3, 10), seed), "block": 4}, {"x": "float"}, {}, PYTORCH_ANY_SHAPE)
    if fn_module.startswith("ladder_") or fn_module == "triton_attention":
        d = 32 if fn_module.startswith("ladder_") else 16
        heads = 1

        def make():
            args = {
                "q": _rand((batch, heads, n, d), seed),
                "k": _rand((batch, heads, n, d), seed + 1),
                "v": _rand((batch, heads, n, d), seed + 2),
            }
            start, end = _times(trees)
            if target.endswith("tree_attention_dense"):
                from course.oracle import dense_tree_mask

                return {**args, "mask": dense_tree_mask(start, end)}
            return {**args, "start": start, "end": end}

        kinds = {"q": "float", "k": "float", "v": "float"}
        kinds.update({"mask": "mask"} if target.endswith("dense") else {"start": "times", "end": "times"})
        return Call(make, kinds, {"start": ("start", "end"), "end": ("start", "end")})
    if fn_module == "deft":
        lengths = [draw(st.integers(1, 5)) for _ in range(n)]
        queries = sorted(set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))))
        tree = trees[0]
        block = draw(st.sampled_from([16, 32]))
        if target in ("deft.node_groups", "deft.flatten_blocks"):

            def make():
                args = {
                    "parents": list(tree),
                    "lengths": list(lengths),
                    "query_nodes": list(queries),
                    "device": DEVICE,
                }
                return {**args, "block_tokens": block} if target == "deft.flatten_blocks" else args

            return Call(
                make,
                {"parents": "list_tree", "lengths": "list_lengths", "query_nodes": "list_nodes"},
                {"query_nodes": ("query_nodes",)},
            )
        prepare = launcher("deft.flatten_blocks" if "flatten" in target else "deft.node_groups")
        prepared = (
            prepare(tree, lengths, queries, block, DEVICE)
            if "flatten" in target
            else prepare(tree, lengths, queries, DEVICE)
        )
        tokens = sum(lengths)
        return Call(
            lambda: {
                "q": _rand((len(queries), 2, 16), seed),
                "k": _rand((tokens, 1, 16), seed + 1),
                "v": _rand((tokens, 1, 16), seed + 2),
                "prepared": prepared,
            },
            {"q": "float", "k": "float", "v": "float"},
            {"k": ("k", "v"), "v": ("k", "v")},
        )
    if fn_module == "emssd":
        counts = [draw(st.integers(0, 3)) for _ in range(batch)]
        counts[0] = max(counts[0], 1)
        lengths = [draw(st.integers(0, 6)) for _ in range(batch)]
        starts, slots = emssd_checks.scattered_layout(counts, lengths, seed)
        return Call(
            lambda: {
                "q": _rand((sum(counts), 2, 16), seed),
                "k_cache": _rand((slots, 1, 16), seed + 1),
                "v_cache": _rand((slots, 1, 16), seed + 2),
                "counts": torch.tensor(counts, dtype=torch.int32, device=DEVICE),
                "kv_starts": torch.tensor(starts, dtype=torch.int32, device=DEVICE),
                "kv_lengths": torch.tensor(lengths, dtype=torch.int32, device=DEVICE),
            },
            {
                "q": "float",
                "k_cache": "float",
                "v_cache": "float",
                "counts": "counts",
                "kv_starts": "positions",
                "kv_lengths": "positions",
            },
            {"counts": ("counts",), "kv_starts": ("kv_starts",), "kv_lengths": ("kv_lengths",)},
        )
    if fn_module == "spec_sampling":
        gamma = draw(st.integers(1, 3))
        vocab = draw(st.sampled_from([5, 15, 16, 17, 33]))
        logits = target.endswith("sigmoid_speculative_sampling")
        g = torch.Generator().manual_seed(seed)
        draft = torch.randint(0, vocab, (batch, gamma), generator=g, dtype=torch.int32).to(DEVICE)

        def make():
            if logits:
                q, p = _rand((batch, gamma, vocab), seed), _rand((batch, gamma + 1, vocab), seed + 1)
            else:
                q, p = _probs((batch, gamma, vocab), seed), _probs((batch, gamma + 1, vocab), seed + 1)
            args = {
                "draft_tokens": draft.clone(),
                "q": q,
                "p": p,
                "accept_uniforms": _uniforms((batch, gamma), seed),
            }
            if logits:
                args["q_logits"], args["p_logits"] = args.pop("q"), args.pop("p")
            if target.endswith("tile_pass"):
                return args
            return {**args, "sample_uniforms": _uniforms((batch, gamma + 1), seed + 1)}

        kinds = {"draft_tokens": "tokens", "accept_uniforms": "uniforms"}
        kinds.update({"q_logits": "float", "p_logits": "float"} if logits else {"q": "probs", "p": "probs"})
        if not target.endswith("tile_pass"):
            kinds["sample_uniforms"] = "uniforms"
        return Call(make, kinds, {})
    if target in ("swiftspec.compact", "swiftspec.naive_compact"):

        def make():
            src = torch.tensor([[5, 6, 7], [9, 8, 0]], dtype=torch.int32, device=DEVICE)
            dst = torch.tensor([[2, 3, 4], [3, 4, 0]], dtype=torch.int32, device=DEVICE)
            counts = torch.tensor([3, 2], dtype=torch.int32, device=DEVICE)
            return {"cache": _rand((2, 2, 12, 16), seed), "src": src, "dst": dst, "counts": counts}

        return Call(
            make,
            {"cache": "cache", "src": "moves_src", "dst": "moves_dst", "counts": "move_counts"},
            {"src": ("src",), "dst": ("dst",)},
        )
    if target == "swiftspec.tree_cache_attention":
        prefix = draw(st.integers(0, 4))
        width = draw(st.integers(1, min(3, n)))
        nodes = tuple(range(n - width, n))
        samples = [(prefix, tuple(trees[b]), nodes, None) for b in range(batch)]
        kwargs, _ = swiftspec_checks.attention_problem(samples, 2, 1, width, 16, torch.float32, seed)
        kinds = {
            "q": "float",
            "k_cache": "cache_attn",
            "v_cache": "cache_attn",
            "q_start": "times",
            "q_end": "times",
            "kv_start": "kv_times",
            "kv_end": "kv_times",
            "prefix_lengths": "positions",
            "tree_lengths": "positions",
        }
        return Call(lambda: {name: value.clone() for name, value in kwargs.items()}, kinds, {})
    if fn_module == "tree_verification":
        vocab = draw(st.sampled_from([5, 16, 17, 40]))
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, vocab, (batch, n), generator=g, dtype=torch.int32).to(DEVICE)
        if target.endswith("parents_from_times"):
            return Call(
                lambda: dict(zip(("start", "end"), _times(trees), strict=True)),
                {"start": "times", "end": "times"},
                {},
            )
        if target.endswith("target_argmax"):
            return Call(lambda: {"target": _rand((batch, n, vocab), seed)}, {"target": "float"}, {})
        if target.endswith("greedy_tree_verification"):
            return Call(
                lambda: {
                    "tree": inputs.batch_of_trees(trees, DEVICE),
                    "tokens": tokens.clone(),
                    "target": _rand((batch, n, vocab), seed),
                },
                {"tree": "parents", "tokens": "tokens", "target": "float"},
                {"tree": ("tree", "parents")},
            )
        return Call(
            lambda: {
                "tree": inputs.batch_of_trees(trees, DEVICE),
                "tokens": tokens.clone(),
                "q": _probs((batch, n, vocab), seed, zero_every=3),
                "p": _probs((batch, n, vocab), seed + 1),
                "accept_uniforms": _uniforms((batch, n), seed),
                "sample_uniforms": _uniforms((batch, n), seed + 1),
                "replacement": True,  # random tokens may repeat among siblings: independent draws
            },
            {
                "tree": "parents",
                "tokens": "tokens",
                "q": "probs",
                "p": "probs",
                "accept_uniforms": "uniforms_from1",
                "sample_uniforms": "uniforms",
            },
            {"tree": ("tree", "parents")},
        )
    raise AssertionError(f"no builder for {target}")


# --------------------------------------------------------------------------- corruptions

MUST_RAISE = "must raise"
MAY_ACCEPT = "may accept, then equal"


def _bad_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.int32 if t.is_floating_point() else torch.float32


def corruptions(kind: str, value, draw) -> list[tuple[str, str, Callable]]:
    """(label, rule, corrupt(value) -> bad value) for an argument of this kind."""
    out: list[tuple[str, str, Callable]] = []
    if kind.startswith("list_"):
        i = draw(st.integers(0, len(value) - 1))

        def put(x, i=i):
            return lambda v: v[:i] + [x] + v[i + 1 :]

        out += [
            ("not a list", MUST_RAISE, lambda v: "0"),
            ("float entry", MUST_RAISE, put(1.5)),
            ("bool entry", MUST_RAISE, put(True)),
            ("negative entry", MUST_RAISE, put(-3)),
            ("empty", MUST_RAISE, lambda v: []),
        ]
        if kind == "list_tree":
            out += [
                ("two roots", MUST_RAISE, lambda v: [-1, -1] + v[2:] if len(v) > 1 else [-1, -1]),
                ("parent after child", MUST_RAISE, lambda v: [-1, 2, 0] + v[3:] if len(v) > 2 else [-1, 1]),
                ("out of range", MUST_RAISE, put(len(value) + 3) if i else put(5)),
            ]
        if kind == "list_lengths":
            out += [("zero length", MUST_RAISE, put(0)), ("wrong count", MUST_RAISE, lambda v: v + [1])]
        if kind == "list_nodes":
            out += [("node out of range", MUST_RAISE, put(99))]
        return out
    if not isinstance(value, torch.Tensor):
        return out
    shape = tuple(value.shape)
    index = tuple(draw(st.integers(0, s - 1)) for s in shape) if value.numel() else ()

    def at(x, index=index):
        def corrupt(v):
            v = v.clone()
            v[index] = x
            return v

        return corrupt

    out += [
        ("wrong dtype", MUST_RAISE, lambda v: v.to(_bad_dtype(v))),
        ("0-d", MUST_RAISE, lambda v: v.reshape(-1)[0].clone()),
        ("extra dim", MUST_RAISE, lambda v: v.unsqueeze(0).expand(2, *v.shape).contiguous()),
        ("other device", MUST_RAISE, lambda v: torch.empty(v.shape, dtype=v.dtype, device=OTHER_DEVICE)),
        ("empty", MUST_RAISE, lambda v: v[..., :0].contiguous() if v.dim() else v.reshape(0)),
        ("non-contiguous view", MAY_ACCEPT, lambda v: _strided(v)),
        ("list", MAY_ACCEPT, lambda v: v.tolist()),
    ]
    if value.is_floating_point() and kind not in ("cache_attn", "cache"):  # a cache may hold anything
        out += [("NaN", MUST_RAISE, at(float("nan"))), ("inf", MUST_RAISE, at(float("inf")))]
    if kind == "cache_attn":  # rows past P + T are unused capacity: anything there is ignored
        out += [("NaN in unused capacity", MAY_ACCEPT, lambda v: _poison_tail(v))]
    if kind == "probs":
        out += [("negative", MUST_RAISE, at(-0.25)), ("sum != 1", MUST_RAISE, lambda v: v * 1.5)]
    if kind in ("uniforms", "uniforms_from1"):
        if kind == "uniforms_from1" and shape[-1] > 1:
            index = index[:-1] + (max(1, index[-1]),)
        if kind == "uniforms" or shape[-1] > 1:
            out += [("u = 1", MUST_RAISE, at(1.0, index)), ("u < 0", MUST_RAISE, at(-0.1, index))]
    if kind == "lse":
        out = [c for c in out if c[0] != "inf"] + [("+inf", MUST_RAISE, at(float("inf")))]
    if kind == "parents":
        n = shape[-1]
        out += [("root not -1", MUST_RAISE, at(0, index[:-1] + (0,)))]
        if n > 1:
            node = max(1, index[-1])
            out += [
                ("two roots", MUST_RAISE, at(-1, index[:-1] + (node,))),
                ("id out of range", MUST_RAISE, at(n + 2, index[:-1] + (node,))),
                ("parent after child / cycle", MUST_RAISE, at(node, index[:-1] + (node,))),
            ]
        if n > 2:
            out += [("parent after child", MUST_RAISE, at(n - 1, index[:-1] + (1,)))]
    if kind in ("times", "kv_times"):  # kv times of prefix rows and unused capacity are ignored
        n, rule = shape[-1], MUST_RAISE if kind == "times" else MAY_ACCEPT
        out += [("time out of range", rule, at(n + 5)), ("negative time", rule, at(-1))]
    if kind == "tokens":
        out += [("token out of range", MUST_RAISE, at(10**6)), ("negative token", MUST_RAISE, at(-1))]
    if kind in ("positions", "counts"):
        out += [("negative", MUST_RAISE, at(-1)), ("past the cache", MUST_RAISE, at(10**6))]
    if kind in ("moves_src", "moves_dst"):  # sample 0 moves 5 -> 2: src 1 or dst 11 shifts right
        out += [
            ("out of range", MUST_RAISE, at(99, (0, 0))),
            ("negative", MUST_RAISE, at(-1, (0, 0))),
            ("right shift", MUST_RAISE, at(1 if kind == "moves_src" else 11, (0, 0))),
        ]
    if kind == "move_counts":
        out += [("counts too large", MUST_RAISE, at(4, (0,))), ("negative", MUST_RAISE, at(-1, (1,)))]
    if kind == "mask":
        row = index[:-1]
        out += [("row with no visible key", MUST_RAISE, lambda v, row=row: _blind(v, row))]
    return out


def _strided(v: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view (every other element of a wider tensor)."""
    if v.dim() == 0:
        return v
    wide = torch.zeros((*v.shape[:-1], 2 * v.shape[-1]), dtype=v.dtype, device=v.device)
    wide[..., ::2] = v
    return wide[..., ::2]


def _poison_tail(v: torch.Tensor) -> torch.Tensor:
    v = v.clone()
    v[:, :, -1:] = float("nan")  # the last slot: attention_problem leaves 5 slots of spare capacity
    return v


def _blind(v: torch.Tensor, row) -> torch.Tensor:
    v = v.clone()
    v[row] = False
    return v


# --------------------------------------------------------------------------- the property


@contextmanager
def time_limit(seconds: int):
    """Fail instead of hanging (SIGALRM: the main thread of a Unix process)."""

    def expired(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().cpu().flatten()
    flat = torch.empty_like(flat, memory_format=torch.contiguous_format).copy_(flat)  # stride 1
    return flat.view(torch.uint8) if flat.dtype != torch.bool else flat


def same(a, b) -> bool:
    """Bit for bit (NaN equals NaN), through tuples and lists."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.device.type == "meta" or b.device.type == "meta":
            return a.shape == b.shape and a.dtype == b.dtype
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def snapshot(args: dict) -> dict:
    return {
        k: (v.clone() if isinstance(v, torch.Tensor) and v.device.type != "meta" else v)
        for k, v in args.items()
    }


TARGETS = list(LAUNCHERS)
# Targets whose accepted corruptions run a slow kernel twice in the simulator: fewer examples there.
SLOW_IN_SIMULATOR = {"swiftspec.tree_cache_attention": 4, "trees.dfs_times": 6, "ladder_k2.tree_attention": 6}


def _examples(target: str) -> int:
    examples = settings.get_profile("fuzz").max_examples
    return min(examples, SLOW_IN_SIMULATOR.get(target, examples)) if SIM else examples


@pytest.mark.parametrize("target", TARGETS)
def test_malformed_input_is_refused_by_name(target):
    settings(settings.get_profile("fuzz"), max_examples=_examples(target))(
        given(data=st.data())(_check_refusal)
    )(target)


def _check_refusal(target, data):
    fn = launcher(target)
    call = build(target, data.draw)
    valid = call.make()
    name = data.draw(st.sampled_from(sorted(call.kinds)), label="argument")
    options = [c for c in corruptions(call.kinds[name], valid[name], data.draw) if c[0] not in call.skip]
    label, rule, corrupt = data.draw(st.sampled_from(options), label="corruption")
    args = dict(valid)
    args[name] = corrupt(valid[name])
    before = snapshot(args)
    aliases = call.names.get(name, (name,))
    with time_limit(120):
        try:
            result = fn(**args)
        except (ValueError, TypeError) as error:
            message = str(error)
            assert any(alias in message for alias in aliases), (
                f"{target}, {name} {label}: the message {message!r} does not name {name}"
            )
            result = None
        else:
            assert rule == MAY_ACCEPT, f"{target}: {name} with {label} was accepted"
            want = fn(**call.make())
            assert same(result, want), f"{target}: {name} as a {label} gives a different result"
    for key, old in before.items():
        if target.endswith("compact") and key == "cache" and result is not None:
            continue  # compaction writes the cache: only a refusal must leave it alone
        assert same(args[key], old), f"{target} changed its argument {key} ({name} with {label})"
