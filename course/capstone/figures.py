"""The capstone's figures (notebook 19): the decoder's loop, one round's tree, and the measurements
of capstone.json (`python -m course figures capstone` writes capstone.png and capstone_timeline.png
beside it)."""

from __future__ import annotations

from course.measure.plots import (
    BLUE,
    GREEN,
    GREY,
    INK,
    ORANGE,
    SKY,
    VERMILLION,
    legend_below,
    new_ax,
    style_ax,
)

METHODS = ("autoregressive", "chain", "tree")
LABELS = {"autoregressive": "plain decoding", "chain": "chain", "tree": "tree"}
COLORS = {"autoregressive": GREY, "chain": ORANGE, "tree": BLUE}
PHASE_COLORS = {"draft": SKY, "verify": BLUE, "commit": GREEN, "wait": VERMILLION, "step": GREY}
TARGETS = {"tree_over_plain": 2.0, "tree_over_chain": 1.2}  # B = 1, greedy


def primary(row: dict) -> bool:
    """A row of the final draft at temperature 1 (the sweep's weaker drafts and T = 0.6 rows are for
    `trees_figure`)."""
    return row.get("draft", "final") == "final" and row.get("temperature", 1.0) == 1.0


def speed_rows(rows: list[dict], everything: bool = False) -> list[dict]:
    return [r for r in rows if r.get("figure") == "speed" and r.get("median_ms") is not None
            and (everything or primary(r))]


def best(rows: list[dict], name: str, batch: int, mode: str) -> dict | None:
    """The fastest measured row of a method at (B, mode)."""
    found = [r for r in speed_rows(rows) if r["name"] == name and r["B"] == batch and r["mode"] == mode]
    return max(found, key=lambda r: r["tokens_per_s"]) if found else None


def setting_label(row: dict) -> str:
    if row["name"] == "autoregressive":
        return "plain"
    if row["name"] == "chain":
        return f"k={row['steps']}"
    shape = f"{row['tree']} " if row.get("tree") else ""
    return f"{shape}bs={row['tree_size']} w={row['width']} b={row['branch']} s={row['steps']}"


def plot(rows: list[dict], note: str | None = None):
    """Three panels from the rows of capstone.json: tokens/s of plain, the fastest chain and the
    fastest tree per batch and mode; the B = 1 greedy sweep (speed-up against tokens per target call);
    the speed-up predicted from the measured terms against the measured one."""
    import matplotlib.pyplot as plt

    speed = speed_rows(rows)
    if not speed:
        raise ValueError("no 'speed' rows to plot")
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), layout="constrained")
    ax = axes[0]
    groups = sorted({(r["B"], r["mode"]) for r in speed}, key=lambda g: (g[1] != "greedy", g[0]))
    for g, (batch, mode) in enumerate(groups):
        plain = best(rows, "autoregressive", batch, mode)
        for m, name in enumerate(METHODS):
            row = best(rows, name, batch, mode)
            if row is None:
                continue
            x = g * (len(METHODS) + 1) + m
            ax.bar(x, row["tokens_per_s"], color=COLORS[name], label=LABELS[name] if g == 0 else None)
            if plain is not None and name != "autoregressive":
                ax.text(x, row["tokens_per_s"], f"{row['tokens_per_s'] / plain['tokens_per_s']:.2f}x",
                        ha="center", va="bottom", fontsize=8, color=INK)
    ax.set_xticks([g * (len(METHODS) + 1) + 1 for g in range(len(groups))],
                  [f"B = {b}, {m}" for b, m in groups], fontsize=9)
    ax.set_ylabel("tokens / s (whole batch)")
    ax.legend(fontsize=8, frameon=False)
    style_ax(ax, "fastest setting of each method", grid_axis="y")
    ax = axes[1]
    sweep = [r for r in speed if r["B"] == 1 and r["mode"] == "greedy" and r["name"] != "autoregressive"]
    for row in sweep:
        ax.scatter(row["tokens_per_call"], row.get("speedup", float("nan")), color=COLORS[row["name"]], s=30,
                   zorder=3)
        ax.annotate(setting_label(row), (row["tokens_per_call"], row.get("speedup", float("nan"))),
                    fontsize=7, xytext=(3, 3), textcoords="offset points", color=INK)
    ax.axhline(1.0, color=GREY, lw=1, ls="--")
    ax.axhline(TARGETS["tree_over_plain"], color=VERMILLION, lw=1, ls=":", label="target: 2x")
    ax.set_xlabel("tokens per target call (tau)")
    ax.set_ylabel("speed-up over plain decoding")
    ax.legend(fontsize=8, frameon=False)
    style_ax(ax, "B = 1, greedy: every setting", grid_axis="both")
    ax = axes[2]
    both = [r for r in speed if r.get("predicted_speedup") is not None and r.get("speedup") is not None]
    for row in both:
        ax.scatter(row["predicted_speedup"], row["speedup"], color=COLORS[row["name"]], s=24, zorder=3,
                   marker="o" if row["mode"] == "greedy" else "^")
    if both:
        top = max(max(r["predicted_speedup"], r["speedup"]) for r in both) * 1.05
        ax.plot([0, top], [0, top], color=GREY, lw=1, ls="--")
        ax.fill_between([0, top], [0, 0.85 * top], [0, 1.15 * top], color=GREY, alpha=0.12, lw=0)
    ax.set_xlabel("predicted: tau * T_plain / (s T_draft + T_verify + T_commit + T_wait)")
    ax.set_ylabel("measured speed-up")
    style_ax(ax, "the formula with its measured terms (band: 15 %)", grid_axis="both")
    if note:
        fig.suptitle(note, fontsize=9, color=INK)
    return fig


def timeline_figure(rows: list[dict], ax=None):
    """One round of the tree decoder and plain decoding's steps over the same span, with every kernel
    launched from Python ("eager") and as CUDA graphs, from the CUDA events of capstone.json's
    "timeline" rows: each phase from start to end on the GPU."""
    from matplotlib.patches import Patch

    lanes = [r for r in rows if r.get("figure") == "timeline"]
    ax = new_ax(ax, (14, 3.2))
    if not lanes:
        ax.text(0.5, 0.5, "no timeline rows in these results", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
        return ax
    lanes.sort(key=lambda r: (r["name"] != "tree", not r["graphs"]))
    span = max(r["median_ms"] for r in lanes if r["name"] == "tree") if any(
        r["name"] == "tree" for r in lanes) else max(r["median_ms"] for r in lanes)
    for y, row in enumerate(lanes):
        phases = row["phases"]
        if row["name"] == "autoregressive":  # repeat the measured steps over the round's span
            step = row["means"]["step"]
            phases = [["step", i * step, (i + 1) * step] for i in range(max(1, int(span / step)))]
        for name, start, end in phases:
            ax.barh(y, end - start, left=start, height=0.6, color=PHASE_COLORS.get(name, GREY),
                    edgecolor="white", linewidth=0.6)
        if row["name"] == "tree":
            label = f"{phases[-1][2]:.2f} ms: {row['tokens_per_call']:.1f} tokens per sample"
        else:
            label = f"{len(phases)} steps of {phases[0][2]:.2f} ms: 1 token each"
        ax.text(min(span, phases[-1][2]) + 0.01 * span, y, label, va="center", fontsize=8, color=INK)
    ax.set_yticks(range(len(lanes)), [f"{'tree round' if r['name'] == 'tree' else 'plain steps'}, "
                                      f"{'graphs' if r['graphs'] else 'eager'}" for r in lanes], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, span * 1.25)
    ax.set_xlabel("ms on the device (CUDA events between phases)")
    legend_below(ax, [Patch(color=c, label=n) for n, c in PHASE_COLORS.items()])
    style_ax(ax, "where a round's time goes", grid_axis="x")
    return ax


def formula_terms(row: dict) -> dict:
    """The speed-up formula's measured terms of one speculative row, and both sides of it."""
    steps = row["steps"]
    return {"tau": row["tokens_per_call"], "T_plain": row["t_plain_ms"], "steps": steps,
            "T_draft": row["t_draft_ms"], "T_verify": row["t_verify_ms"], "T_commit": row["t_commit_ms"],
            "T_wait": row["t_wait_ms"], "round": row["round_ms"], "predicted": row.get("predicted_speedup"),
            "measured": row.get("speedup"),
            "shares": {"draft": steps * row["t_draft_ms"] / row["round_ms"],
                       "verify": row["t_verify_ms"] / row["round_ms"],
                       "commit": row["t_commit_ms"] / row["round_ms"],
                       "wait": row["t_wait_ms"] / row["round_ms"]}}


def summary(document: dict) -> str:
    """The targets at B = 1, greedy, met or missed, and the formula's terms of the fastest tree."""
    rows = document["rows"]
    plain, chain, tree = (best(rows, name, 1, "greedy") for name in METHODS)
    if plain is None or tree is None:
        return "capstone: no B = 1 greedy rows of plain and tree decoding"
    lines = []
    def verdict(ratio: float, target: str) -> str:
        return f"target {TARGETS[target]}x: {'met' if ratio >= TARGETS[target] else 'missed'}"

    over_plain = tree["tokens_per_s"] / plain["tokens_per_s"]
    lines.append(f"tree ({setting_label(tree)}) {over_plain:.2f}x plain decoding at B = 1, greedy "
                 f"({verdict(over_plain, 'tree_over_plain')})")
    if chain is not None:
        over_chain = tree["tokens_per_s"] / chain["tokens_per_s"]
        lines.append(f"tree {over_chain:.2f}x the fastest chain ({setting_label(chain)}) "
                     f"({verdict(over_chain, 'tree_over_chain')})")
    if tree.get("round_ms"):
        t = formula_terms(tree)
        lines.append(f"formula: tau {t['tau']:.2f} x T_plain {t['T_plain']:.3f} ms / ({t['steps']} x T_draft "
                     f"{t['T_draft']:.3f} + T_verify {t['T_verify']:.3f} + T_commit {t['T_commit']:.3f} + "
                     f"T_wait {t['T_wait']:.3f} ms) = {t['predicted']:.2f} (measured {t['measured']:.2f})")
    return "\n".join(lines)


LOOP_STEPS = (
    ("prefill", "emssd.unpadded_attention\n(notebook 17)", "prompts concatenated,\nper-sample KV starts"),
    ("draft: grow the tree", "swiftspec.tree_cache_attention\n(notebook 18)",
     "w most probable nodes per\nstep, `branch` children each"),
    ("verify: one target pass", "swiftspec.tree_cache_attention\n(notebook 18)",
     "bs most probable nodes\nas queries"),
    ("accept", "tree_verification\n(notebook 16)", "greedy walk or SpecInfer's\nspeculative sampling"),
    ("commit", "swiftspec.compact\n(notebook 18)", "accepted path's KV ->\nprefix, in both caches"),
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
    ax.text(0.5 * (xs[1] + xs[-1]), 0.9, "next round: every sample, its own prefix and tree; each stage a "
            "CUDA graph on a GPU",
            ha="center", fontsize=9, color="#c0504d", transform=ax.transAxes)
    ax.set_axis_off()
    fig.tight_layout()
    return fig


def round_figure(entry: dict, ax=None, title: str | None = None):
    """One round of `decoder.speculative(..., trace=...)`: the draft tree, tokens as characters; the
    accepted path (green), the other nodes sent to the target (blue), nodes not verified (grey); a
    thick outline marks the nodes the draft ran (the others are leaves: drafted, never run)."""
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
        ran = entry.get("run", [True] * len(parents))[v]
        ax.scatter([x], [y], s=420, c=face, edgecolors="#333333", linewidths=2.2 if ran else 0.6, zorder=2)
        char = VOCAB[tokens[v]]
        ax.text(x, y, {"\n": "\\n", " ": "\u2423"}.get(char, char), ha="center", va="center", fontsize=10,
                zorder=3, family="monospace")
    ax.set_axis_off()
    nxt = VOCAB[entry["next_token"]]
    ran = sum(entry.get("run", []))
    ax.set_title(title or f"round {entry['round']}: {len(parents)} draft nodes ({ran} run by the draft), "
                 f"{len(chosen)} verified, {len(path) - 1} accepted, next token {nxt!r}", fontsize=10)
    return ax


def measured_figure(document: dict):
    """capstone.png: `plot` of a results document, labelled with its device and date."""
    return plot(document["rows"], note=f"{document['device']}, {document['date'][:10]}")


def measured_timeline(document: dict):
    """capstone_timeline.png: `timeline_figure` of a results document."""
    ax = timeline_figure(document["rows"])
    ax.figure.suptitle(f"{document['device']}, {document['date'][:10]}", fontsize=9, color=INK)
    return ax.figure


SHAPE_COLORS = {"fixed": GREY, "sequoia": GREEN, "dynamic": BLUE}
SHAPE_MARKERS = {"fixed": "s", "sequoia": "o", "dynamic": "^"}


def conditions(rows: list[dict]) -> list[tuple[str, float, str]]:
    """(mode, temperature, draft) of every B = 1 sweep in the rows."""
    found = {(r["mode"], r.get("temperature", 1.0), r.get("draft", "final")) for r in speed_rows(rows, True)
             if r["B"] == 1}
    return sorted(found, key=lambda c: (c[0] != "greedy", -c[1], c[2] == "final", c[2]))


def fastest(rows: list[dict], name: str, mode: str, temperature: float, draft: str, shape=None, batch=1):
    found = [r for r in speed_rows(rows, True) if r["name"] == name and r["B"] == batch and r["mode"] == mode
             and r.get("temperature", 1.0) == temperature and r.get("draft", "final") == draft
             and (shape is None or r.get("tree") == shape) and not r.get("replacement")]
    return max(found, key=lambda r: r["tokens_per_s"]) if found else None


def rates_of(rows: list[dict], mode: str, temperature: float, draft: str) -> list[float] | None:
    for r in rows:
        if (r.get("figure") == "acceptance" and r["mode"] == mode and r["temperature"] == temperature
                and r["draft"] == draft):
            return r["rates"]
    return None


def trees_figure(document: dict):
    """capstone_trees.png: (left) the fastest tree of each shape over the fastest chain, against the
    draft's acceptance of its first child, for every draft and mode; (right) tokens per call predicted
    by the dynamic program (Sequoia) and by Leviathan's formula (chains) against the measured ones."""
    import matplotlib.pyplot as plt

    rows = document["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), layout="constrained")
    ax = axes[0]
    for mode, temperature, draft in conditions(rows):
        chain = fastest(rows, "chain", mode, temperature, draft)
        rates = rates_of(rows, mode, temperature, draft)
        if chain is None or rates is None:
            continue
        for shape in SHAPE_COLORS:
            tree = fastest(rows, "tree", mode, temperature, draft, shape)
            if tree is not None:
                ax.scatter(rates[0], tree["tokens_per_s"] / chain["tokens_per_s"], color=SHAPE_COLORS[shape],
                           marker=SHAPE_MARKERS[shape], s=36, zorder=3,
                           facecolors="none" if mode == "sample" else SHAPE_COLORS[shape])
    ax.axhline(1.0, color=GREY, lw=1, ls="--")
    ax.axhline(TARGETS["tree_over_chain"], color=VERMILLION, lw=1, ls=":")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, marker=SHAPE_MARKERS[s], ls="", label=s)
               for s, c in SHAPE_COLORS.items()]
    handles += [Line2D([], [], color=INK, marker="o", ls="", label="greedy (filled)"),
                Line2D([], [], color=INK, marker="o", ls="", markerfacecolor="none", label="sampling (open)")]
    ax.legend(handles=handles, fontsize=7, frameon=False)
    ax.set_xlabel("the draft's acceptance of its first child, r[0] (weaker drafts to the left)")
    ax.set_ylabel("fastest tree / fastest chain (tokens/s)")
    style_ax(ax, "B = 1: does the tree beat the chain?", grid_axis="both")
    ax = axes[1]
    for row in speed_rows(rows, True):
        if row["B"] != 1:
            continue
        predicted = row.get("predicted_tokens_per_call") or row.get("leviathan_tokens_per_call")
        if predicted is None:
            continue
        shape = row.get("tree") if row["name"] == "tree" else None
        ax.scatter(predicted, row["tokens_per_call"], s=18, zorder=3,
                   color=SHAPE_COLORS.get(shape, ORANGE), marker=SHAPE_MARKERS.get(shape, "D"))
    top = max((r["tokens_per_call"] for r in speed_rows(rows, True)), default=1.0) * 1.1
    ax.plot([1, top], [1, top], color=GREY, lw=1, ls="--")
    ax.set_xlabel("predicted tokens per call (Sequoia's program; chains: Leviathan's formula)")
    ax.set_ylabel("measured tokens per call")
    ax.legend(handles=[Line2D([], [], color=SHAPE_COLORS["sequoia"], marker="o", ls="", label="sequoia"),
                       Line2D([], [], color=ORANGE, marker="D", ls="", label="chain")],
              fontsize=7, frameon=False)
    style_ax(ax, "the positional model against the decoder", grid_axis="both")
    fig.suptitle(f"{document['device']}, {document['date'][:10]}", fontsize=9, color=INK)
    return fig


FIGURES = {"capstone": measured_figure, "capstone_timeline": measured_timeline,
           "capstone_trees": trees_figure}


# --------------------------------------------------------------------------- notebook 21's reports


def _cell(row: dict | None) -> str:
    return f"{row['tokens_per_s']:7.0f} ({row['tokens_per_call']:4.2f})" if row else f"{'-':>14s}"


def best_tree_of(rows: list[dict], mode: str, temperature: float, draft: str) -> dict | None:
    """The fastest tree of any shape (siblings without replacement) of one draft and mode, B = 1."""
    found = [fastest(rows, "tree", mode, temperature, draft, shape) for shape in SHAPE_COLORS]
    found = [row for row in found if row is not None]
    return max(found, key=lambda r: r["tokens_per_s"]) if found else None


def shape_table(document: dict) -> str:
    """Tokens/s (tokens per call) of plain decoding, the fastest chain and the fastest tree of each
    shape, per mode and draft at B = 1, with the best tree over the best chain."""
    rows = document["rows"]
    lines = [f"{document['device']}, {document['date'][:10]}; tokens/s (tokens per call), B = 1",
             f"{'mode':12s} {'draft':15s} {'plain':>7s} {'chain':>14s} {'fixed':>14s} {'sequoia':>14s} "
             f"{'dynamic':>14s}  tree/chain"]
    for mode, t, draft in conditions(rows):
        plain = fastest(rows, "autoregressive", mode, t, "final")
        chain = fastest(rows, "chain", mode, t, draft)
        trees = [fastest(rows, "tree", mode, t, draft, shape) for shape in ("fixed", "sequoia", "dynamic")]
        tree = best_tree_of(rows, mode, t, draft)
        ratio = f"{tree['tokens_per_s'] / chain['tokens_per_s']:5.2f}x" if tree and chain else "  -"
        label = mode if mode == "greedy" else f"sample T={t:g}"
        lines.append(f"{label:12s} {draft:15s} {plain['tokens_per_s'] if plain else float('nan'):7.0f} "
                     f"{_cell(chain)} {' '.join(_cell(r) for r in trees)}  {ratio}")
    for r in speed_rows(rows, True):
        if r.get("replacement") and r["B"] == 1:
            same = fastest(rows, "tree", r["mode"], r["temperature"], r["draft"], "fixed")
            if same is not None:
                lines.append(f"fixed tree, {r['mode']} T={r['temperature']:g}, {r['draft']} draft: siblings "
                             f"with replacement {r['tokens_per_call']:.2f} tokens per call, without "
                             f"{same['tokens_per_call']:.2f}")
    return "\n".join(lines)


def _formula_line(name: str, row: dict) -> str:
    t = formula_terms(row)
    return (f"  {name:5s} {setting_label(row)}: tau {t['tau']:.2f} x T_plain {t['T_plain']:.3f} ms / "
            f"({t['steps']} x T_draft {t['T_draft']:.3f} + T_verify {t['T_verify']:.3f} + T_commit "
            f"{t['T_commit']:.3f} + T_wait {t['T_wait']:.3f} ms) = {t['predicted']:.2f} "
            f"(measured {t['measured']:.2f})")


def targets_report(document: dict, target: float = TARGETS["tree_over_chain"]) -> str:
    """Per mode, the final draft's best tree over its best chain against `target`, both rounds' terms,
    and how short the tree's draft step would have to be for the target at its measured tau."""
    rows = document["rows"]
    lines = []
    for mode, t, draft in conditions(rows):
        chain, tree = fastest(rows, "chain", mode, t, draft), best_tree_of(rows, mode, t, draft)
        plain = fastest(rows, "autoregressive", mode, t, "final")
        if draft != "final" or chain is None or tree is None or plain is None:
            continue
        ratio = tree["tokens_per_s"] / chain["tokens_per_s"]
        label = mode if mode == "greedy" else f"sampling at T = {t:g}"
        over_plain = tree["tokens_per_s"] / plain["tokens_per_s"]
        lines.append(f"{label}: best tree {ratio:.2f}x the best chain (target {target}x: "
                     f"{'met' if ratio >= target else 'missed'}), {over_plain:.2f}x plain decoding")
        lines += [_formula_line("chain", chain), _formula_line("tree", tree)]
        need_ms = tree["tokens_per_call"] * chain["round_ms"] / (target * chain["tokens_per_call"])
        rest = tree["t_verify_ms"] + tree["t_commit_ms"] + tree["t_wait_ms"]
        lines.append(f"  for {target}x at this tau the tree's round must take {need_ms:.3f} ms (now "
                     f"{tree['round_ms']:.3f}): draft steps of {1e3 * (need_ms - rest) / tree['steps']:.0f} "
                     f"us at today's verification (now {1e3 * tree['t_draft_ms']:.0f} us)")
    return "\n".join(lines)


def step_profile_report(document: dict, top: int = 5) -> str:
    """The step profile's rows (`course.capstone.step_profile`): each draft step and verification as
    graphs, and the kernels whose time differs most between the chain's step and the tree's."""
    by_key = {row["key"]: row for row in document["rows"]}
    lines = [f"{document['device']}, {document['date'][:10]}, pair {document['rows'][0]['pair']}"]
    for suffix, how in (("", "torch's kernels"), (" fused", "one Triton kernel each")):
        chain, tree = by_key.get("chain greedy" + suffix), by_key.get("tree greedy" + suffix)
        if chain is None or tree is None:
            continue
        lines.append(f"RoPE and SwiGLU as {how}: a draft step as a graph, chain "
                     f"{1e3 * chain['median_ms']:.1f} us, tree of width 4 {1e3 * tree['median_ms']:.1f} us; "
                     f"verification, chain (9 nodes) "
                     f"{1e3 * chain['verify_ms']:.0f} us, tree (48 nodes) {1e3 * tree['verify_ms']:.0f} us")
        a, b = chain["kernels_step1_us"], tree["kernels_step1_us"]
        for name in sorted(set(a) | set(b), key=lambda n: -abs(b.get(n, 0.0) - a.get(n, 0.0)))[:top]:
            lines.append(f"    {name[:64]:64s} chain {a.get(name, 0.0):5.2f} us, "
                         f"tree {b.get(name, 0.0):5.2f} us")
    return "\n".join(lines)
