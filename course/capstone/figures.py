"""The capstone's figures (notebook 19): the decoder's loop, one round's tree, and the measurements
of capstone.json (`python -m course figures capstone` writes capstone.png beside it)."""

from __future__ import annotations

from course.capstone.bench import DEFAULT_TREE, DEFAULT_WIDTH


def plot(rows: list[dict], note: str | None = None):
    """Three panels from the rows of capstone.json: speedup against tree size (one line per width),
    draft tokens accepted per target call against draft quality, and tokens/s of each method."""
    import matplotlib.pyplot as plt

    speed = [r for r in rows if r.get("figure") == "speed" and r.get("median_ms") is not None]
    drafts = [r for r in rows if r.get("figure") == "drafts" and r.get("median_ms") is not None]
    if not speed:
        raise ValueError("no 'speed' rows to plot")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for w in sorted({r["width"] for r in speed if r["name"] == "speculative"}):
        line = sorted((r["tree_size"], r["speedup"]) for r in speed if r["name"] == "speculative"
                      and r["width"] == w)
        ax.plot([x for x, _ in line], [y for _, y in line], "o-", label=f"w = {w}")
    ax.axhline(1.0, color="gray", lw=1, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree size bs (nodes verified per target call)")
    ax.set_ylabel("speedup over autoregressive (tokens/s)")
    ax.set_title("speedup vs tree size and width")
    ax.legend(fontsize=8)
    ax = axes[1]
    if drafts:
        ax.plot(range(len(drafts)), [r["accepted_per_call"] for r in drafts], "o-", label="accepted / call")
        ax.set_xticks(range(len(drafts)), [r["draft"] for r in drafts], rotation=30, ha="right", fontsize=8)
        twin = ax.twinx()
        twin.plot(range(len(drafts)), [r["speedup"] for r in drafts], "s--", color="C1", label="speedup")
        twin.set_ylabel("speedup", color="C1")
    ax.set_ylabel("draft tokens accepted per target call")
    ax.set_xlabel("draft (training steps)")
    ax.set_title(f"acceptance vs draft quality (bs = {DEFAULT_TREE}, w = {DEFAULT_WIDTH})")
    ax = axes[2]
    plain = next(r for r in speed if r["name"] == "autoregressive")
    best = max((r for r in speed if r["name"] == "speculative"), key=lambda r: r["tokens_per_s"])
    default = next((r for r in speed if r["name"] == "speculative" and r["tree_size"] == DEFAULT_TREE
                    and r["width"] == DEFAULT_WIDTH), best)
    bars = [("autoregressive", plain), (f"spec bs={default['tree_size']} w={default['width']}", default),
            (f"best: bs={best['tree_size']} w={best['width']}", best)]
    ax.bar(range(len(bars)), [r["tokens_per_s"] for _, r in bars], color=["gray", "C0", "C2"])
    ax.set_xticks(range(len(bars)), [n for n, _ in bars], fontsize=8)
    ax.set_ylabel("tokens / s (batch total)")
    ax.set_title("greedy decoding, same target")
    if note:
        fig.suptitle(note, fontsize=9)
    fig.tight_layout()
    return fig


LOOP_STEPS = (
    ("prefill", "emssd.unpadded_attention\n(notebook 17)", "prompts concatenated,\nper-sample KV starts"),
    ("draft: grow the tree", "swiftspec.tree_cache_attention\n(notebook 18)",
     "w best leaves per step,\npriority queue (SwiftSpec §3.1)"),
    ("verify: one target pass", "swiftspec.tree_cache_attention\n(notebook 18)",
     "bs most probable nodes\nas queries"),
    ("accept", "tree_verification\n(notebook 16)", "greedy walk or SpecInfer's\nspeculative sampling"),
    ("re-root + compact", "swiftspec.compact\n(notebook 18)", "path -> prefix, surviving\nsubtree reused"),
)


def loop_figure():
    """The decoder's loop as a diagram: each stage, the kernel that runs it and what it does."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig, ax = plt.subplots(figsize=(14, 3.4))
    xs = [0.1 + 0.2 * i for i in range(len(LOOP_STEPS))]
    for i, ((title, kernel, what), x) in enumerate(zip(LOOP_STEPS, xs, strict=True)):
        color = "#eeeeee" if i == 0 else "#dbe9f6"
        ax.add_patch(FancyBboxPatch((x - 0.085, 0.3), 0.17, 0.5, boxstyle="round,pad=0.01", fc=color,
                                    ec="#444444", transform=ax.transAxes))
        ax.text(x, 0.72, title, ha="center", va="center", fontsize=10, fontweight="bold",
                transform=ax.transAxes)
        ax.text(x, 0.56, kernel, ha="center", va="center", fontsize=8.5, family="monospace",
                transform=ax.transAxes)
        ax.text(x, 0.39, what, ha="center", va="center", fontsize=8, color="#333333", transform=ax.transAxes)
        if i:
            ax.add_patch(FancyArrowPatch((xs[i - 1] + 0.087, 0.55), (x - 0.087, 0.55), arrowstyle="-|>",
                                         mutation_scale=14, transform=ax.transAxes, color="#444444"))
    ax.add_patch(FancyArrowPatch((xs[-1], 0.3), (xs[1], 0.3), connectionstyle="arc3,rad=-0.25",
                                 arrowstyle="-|>", mutation_scale=14, transform=ax.transAxes,
                                 color="#c0504d"))
    ax.text(0.5 * (xs[1] + xs[-1]), 0.9, "next round: every unfinished sample, its own prefix and tree",
            ha="center", fontsize=9, color="#c0504d", transform=ax.transAxes)
    ax.set_axis_off()
    fig.tight_layout()
    return fig


def round_figure(entry: dict, ax=None, title: str | None = None):
    """One round of `decoder.speculative(..., trace=...)`: the draft tree, tokens as characters; the
    accepted path (green), the other nodes sent to the target (blue), draft-only nodes (grey)."""
    import matplotlib.pyplot as plt

    from course.capstone.text import VOCAB
    from course.topics.trees.figures import tree_layout

    parents, tokens = entry["parents"], entry["tokens"]
    pos = tree_layout(parents)
    path, chosen = set(entry["path"]), set(entry["chosen"])
    if ax is None:
        width = max(x for x, _ in pos.values()) + 1
        _, ax = plt.subplots(figsize=(min(14, 0.7 * width + 2), 3.6))
    for v, p in enumerate(parents):
        if p >= 0:
            lit = v in path and p in path
            ax.plot(*zip(pos[p], pos[v], strict=True), color="#2e7d32" if lit else "#999999",
                    lw=2.4 if lit else 1, zorder=1)
    for v, (x, y) in pos.items():
        face = "#81c784" if v in path else "#90caf9" if v in chosen else "#eeeeee"
        ax.scatter([x], [y], s=420, c=face, edgecolors="#333333", zorder=2)
        char = VOCAB[tokens[v]]
        ax.text(x, y, {"\n": "\\n", " ": "\u2423"}.get(char, char), ha="center", va="center", fontsize=10,
                zorder=3, family="monospace")
    ax.set_axis_off()
    nxt = VOCAB[entry["next_token"]]
    ax.set_title(title or f"round {entry['round']}: {len(parents)} draft nodes, {len(chosen)} verified, "
                 f"{len(path) - 1} accepted, next token {nxt!r}"
                 + (" (its subtree is reused)" if entry["reused"] else ""), fontsize=10)
    return ax


def measured_figure(document: dict):
    """capstone.png: `plot` of a results document, labelled with its device and date."""
    return plot(document["rows"], note=f"{document['device']}, {document['date'][:10]}")


FIGURES = {"capstone": measured_figure}
