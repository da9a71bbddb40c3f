"""`tools/side_spans.py` off a GPU, on the tiny pair: each side replayed alone against the messages
recorded in lockstep sends what it sent there, and a replay that drifts is refused."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

import course  # noqa: F401  (first: chooses the simulator / interpreter)
from course.capstone import weights

TOOL = Path(__file__).resolve().parents[1] / "tools" / "side_spans.py"


@pytest.fixture
def tool(monkeypatch):
    spec = importlib.util.spec_from_file_location("side_spans", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sizes = dict(NEW_TOKENS=10, PROMPTS=1, REPEATS=2, TREE_SIZE=8, WIDTH=2, STEPS=3)
    for name, value in sizes.items():
        monkeypatch.setattr(module, name, value)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # the replays wait for a GPU, if any
    return module


@pytest.fixture(scope="module")
def pair():
    return weights.load_pair("tiny", dtype=torch.float32)


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_each_side_alone_replays_its_lockstep_messages(tool, pair, mode):
    rows = tool.measure(pair, mode, tool.STEPS, (0.0, 0.01), backend="reference")
    assert [(r["steps"], r["verify_ms_emulated"]) for r in rows] == [(tool.STEPS, 0.0), (tool.STEPS, 0.01)]
    for row in rows:  # one recording, replayed at each verification length
        # One counted replay (REPEATS - 1): a count of passes for every reply but the last (STOP).
        assert sum(row["passes_after_reroot"].values()) == row["rounds"] - tool.PROMPTS
        assert row["rounds"] >= 2 and row["draft_critical_ms"] > 0 and row["target_span_ms"] > 0
        assert row["tokens_per_round"] == tool.NEW_TOKENS / row["rounds"]
    assert rows[0]["passes_after_reroot"] == rows[1]["passes_after_reroot"]  # the same subtrees


def test_a_replay_that_sends_other_subtrees_is_refused(tool, pair, monkeypatch):
    recorded = tool.record

    def another_first_reply(*args):
        subtrees, replies = recorded(*args)
        first = replies[0]
        replies[0] = dataclasses.replace(first, path=[0], next_token=(first.next_token + 1) % 32)
        return subtrees, replies

    monkeypatch.setattr(tool, "record", another_first_reply)
    with pytest.raises(RuntimeError, match="other subtrees than in lockstep"):
        tool.measure(pair, "greedy", tool.STEPS, (0.0,), backend="reference")
