"""The exercises of notebooks 17 and 18: EMS-SD's unpadded batch and SwiftSpec's tree KV cache."""

from __future__ import annotations

from course.checks import Exercise
from course.topics import Topic
from course.topics.kvcache import check

EXERCISES = [
    Exercise("emssd.unpadded_attention_kernel", "17_ems_sd", 4, check.check_unpadded_attention,
             "EMS-SD: restore each flat token's sample by binary search, then its causal KV mask",
             requires=("triton_attention.online_softmax_step",)),
    Exercise("swiftspec.compact_kernel", "18_swiftspec_kv_cache", 3, check.check_compaction,
             "SwiftSpec's compaction: move KV rows left in place, overlap-safe (load, barrier, store)"),
    Exercise("swiftspec.tree_cache_attention_kernel", "18_swiftspec_kv_cache", 4,
             check.check_tree_cache_attention,
             "SwiftSpec's non-square tree mask: w queries against [prefix | tree] by DFS intervals",
             requires=("swiftspec.compact_kernel", "triton_attention.online_softmax_step")),
]

TOPIC = Topic(
    notebooks=("17_ems_sd", "18_swiftspec_kv_cache"), students=("emssd", "swiftspec"),
    specs=("pyspec_ref.kvcache",), oracles=("course.oracle.kvcache",),
    why="one topic, the KV cache of a batch of speculative trees, in two papers' answers: EMS-SD's "
        "unpadded batch (notebook 17, emssd) and SwiftSpec's tree cache (notebook 18, swiftspec). They "
        "share the cache's specification and oracle, the check's problems and one bench (sections "
        "emssd, compaction and attention, in kvcache.json); each student module keeps its paper's name.")
