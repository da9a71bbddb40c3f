"""Notebook 20's figures: the protocol as a sequence diagram (from `pyspec_ref.parallel_tree`'s
message log), the timeline of both workers (simulated or measured), tokens per target call against
the draft's steps per round, serial against parallel as measured (parallel.json;
`course.capstone.parallel_bench` writes parallel.png beside it with `measured_figure`), the
measured sweep of d and of the steps after the re-root at one width (`critical_sweep_figure`), the
selection as a rank count (`rank_figure`) and the rounds whose hosts only launch
(`queued_figure`, from tools/queued_rounds.py's measurements; `loops_figure`, the two loops that
bound such a round, from `parallel_bench.queued_projection`)."""

from __future__ import annotations

from course.measure.plots import (
    BLUE,
    GREEN,
    GREY,
    HIDDEN,
    HIGHLIGHT,
    INK,
    ORANGE,
    SKY,
    VERMILLION,
    VISIBLE,
    cell_grid,
    index_ticks,
    legend_below,
    new_ax,
    style_ax,
    to_numpy,
)

# One colour per kind of work, in every figure: what a side is doing at that moment.
WORK = {
    "verify": BLUE,  # the target's pass over the subtree, and verification
    "grow ahead": GREEN,  # draft steps during verification: off the critical path
    "grow": ORANGE,  # draft steps between receiving ACCEPTED and sending SUBTREE: on it
    "re-root": VERMILLION,
    "select": SKY,
    "wait": HIDDEN,
}
LANES = ("draft", "target")


def _span(event: dict) -> tuple[float, float]:
    if "start_ms" in event:
        return event["start_ms"], event["end_ms"]
    return event["start"], event["end"]


def timeline(events: list[dict], ax=None, title: str | None = None, unit: str = "ms"):
    """Each side's work as bars on its own lane (draft below, target above), coloured by kind,
    the target's passes numbered by round. events: dicts with side, what, round and start/end (or
    start_ms/end_ms)."""
    if not events:
        raise ValueError("events must hold at least one span")
    ax = new_ax(ax, (11, 2.6))
    for event in events:
        if event["side"] not in LANES:
            raise ValueError(f"an event's side must be one of {LANES}, got {event['side']!r}")
        start, end = _span(event)
        lane = LANES.index(event["side"])
        kind = event["what"]
        ax.barh(lane, end - start, left=start, height=0.55, color=WORK.get(kind, GREY),
                edgecolor="white" if kind != "wait" else GREY, linewidth=0.6, zorder=2)
        if kind == "verify" and end - start > 0:
            ax.text((start + end) / 2, lane, f"r{event['round']}", ha="center", va="center", fontsize=8,
                    color="white", zorder=3)
    ax.set_yticks(range(len(LANES)), [f"{lane}" for lane in LANES])
    ax.set_ylim(-0.6, len(LANES) - 0.4)
    ax.set_xlabel(f"time ({unit})")
    style_ax(ax, title, grid_axis="x")
    import matplotlib.patches as mpatches

    shown = [kind for kind in WORK if any(e["what"] == kind for e in events)]
    legend_below(ax, [mpatches.Patch(color=WORK[k], label=k) for k in shown])
    return ax


def _label(message) -> str:
    if message.kind == "subtree":
        return f"SUBTREE({message.round}): {len(message.parents)} nodes"
    path = "→".join(str(j) for j in message.path)
    return f"{message.kind.upper()}({message.round}): path {path}, next {message.next_token}"


def sequence_diagram(messages, times, events, rounds: int = 3, ax=None, title: str | None = None):
    """The protocol between the two workers as a sequence diagram: time runs down, the draft's
    lifeline on the left, the target's on the right, each side's work as a bar on its lifeline and
    each message as an arrow from its sending to its receipt. From `simulate_parallel_tree`'s
    messages, times and events; the first `rounds` rounds."""
    if len(messages) != len(times):
        raise ValueError(f"messages ({len(messages)}) and times ({len(times)}) must pair up")
    shown = [(m, t) for m, t in zip(messages, times, strict=True) if m.round < rounds]
    end = max(received for _, (_, received) in shown)
    end = max([end] + [e["end"] for e in events if e["round"] < rounds and e["start"] <= end])
    ax = new_ax(ax, (8, 0.9 + 1.4 * rounds))
    x = {"draft": 0.0, "target": 1.0}
    for side, at in x.items():
        ax.plot([at, at], [0, end], color=GREY, lw=1, zorder=1)
        ax.text(at, -0.04 * end, side, ha="center", va="bottom", fontsize=10, fontweight="bold", color=INK)
    for event in events:
        if event["round"] < rounds and event["what"] != "wait" and event["start"] < end:
            ax.bar(x[event["side"]], event["end"] - event["start"], bottom=event["start"], width=0.06,
                   color=WORK.get(event["what"], GREY), zorder=2)
    for message, (sent, received) in shown:
        start, stop = (x["draft"], x["target"]) if message.kind == "subtree" else (x["target"], x["draft"])
        ax.annotate("", xy=(stop, received), xytext=(start, sent),
                    arrowprops=dict(arrowstyle="-|>", color=INK, lw=1.1), zorder=3)
        ax.text((start + stop) / 2, (sent + received) / 2, _label(message), ha="center", va="bottom",
                fontsize=8, color=INK, rotation=0, zorder=4,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
    ax.set_xlim(-0.35, 1.35)
    ax.set_ylim(end * 1.03, -0.08 * end)
    ax.set_xticks([])
    ax.set_ylabel("time (target passes)")
    style_ax(ax, title)
    import matplotlib.patches as mpatches

    kinds = [k for k in WORK if k != "wait" and any(e["what"] == k for e in events)]
    legend_below(ax, [mpatches.Patch(color=WORK[k], label=k) for k in kinds], gap_pt=12)
    return ax


def compression_figure(points: list[dict], title: str | None = None):
    """Two panels against d, the draft steps per round, one line per schedule: tokens per target
    call, and clock time per token. points: dicts with schedule, steps, tokens_per_call and
    time_per_token (from simulations or measurements)."""
    import matplotlib.pyplot as plt

    if not points:
        raise ValueError("points must not be empty")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), layout="constrained")
    for schedule, color in (("serial", ORANGE), ("parallel", GREEN)):
        mine = sorted((p for p in points if p["schedule"] == schedule), key=lambda p: p["steps"])
        for ax, key in zip(axes, ("tokens_per_call", "time_per_token"), strict=True):
            ax.plot([p["steps"] for p in mine], [p[key] for p in mine], "o-", color=color, label=schedule)
    style_ax(axes[0], "tokens per target call (compression ratio)", grid_axis="y")
    style_ax(axes[1], "time per token (lower is faster)", grid_axis="y")
    for ax in axes:
        ax.set_xlabel("d: draft steps per round")
        ax.legend(frameon=False, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10, color=INK)
    return fig


def after_reroot(steps: int) -> str:
    """The draft's steps after each re-root (`critical`), in words."""
    return f"{steps} step{'s' * (steps != 1)} after the re-root"


def critical_sweep_figure(rows: list[dict], width: int, base: float | None = None, title: str | None = None):
    """Three panels against d for the measured parallel rows of one draft width (greedy, through
    shared memory, on the most GPUs measured), one line per number of steps after the re-root: tokens
    per target call, the target's median wait, tokens/s (with the serial decoder's, `base`, as a
    dashed line). rows: parallel.json's rows."""
    import matplotlib.pyplot as plt

    mine = _pick(rows, "parallel", "greedy", width=width)
    if not mine:
        raise ValueError(f"no greedy parallel rows at width {width}")
    most = max(r["gpus"] for r in mine)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.3), layout="constrained")
    colors = (GREEN, ORANGE, VERMILLION, BLUE, SKY)
    for i, critical in enumerate(sorted({r.get("critical") or 0 for r in mine})):
        line = sorted((r for r in mine if (r.get("critical") or 0) == critical and r["gpus"] == most
                       and r["transport"] == "shm"), key=lambda r: r["steps"])
        for ax, key in zip(axes, ("tokens_per_call", "target_wait_ms_median", "tokens_per_s"), strict=True):
            ax.plot([r["steps"] for r in line], [r[key] for r in line], "o-", color=colors[i % len(colors)],
                    label=after_reroot(critical))
    if base:
        axes[2].axhline(base, color=GREY, linestyle="--", linewidth=1, label="serial decoder")
    for ax, name in zip(axes, ("tokens per target call", "the target's median wait (ms)", "tokens / s"),
                        strict=True):
        style_ax(ax, name, grid_axis="y")
        ax.set_xlabel("d: draft steps during verification")
        ax.set_xticks(sorted({r["steps"] for r in mine}))
    axes[2].legend(frameon=False, fontsize=8.5)
    fig.suptitle(title or f"parallel, w = {width}, greedy", fontsize=10, color=INK)
    return fig


def queued_figure(document: dict, ax=None, title: str | None = None):
    """The target's wait between two verifications against the draft's GPU work between the verdict
    and the next subtree, for rounds whose messages are device tensors through NCCL: every round
    queued at once (the hosts only launch) and each message awaited by its host, with the GPU work
    alone as a dotted line. document: tools/queued_rounds.py's queued_rounds.json."""
    ax = new_ax(ax, (5.6, 3.4))
    rows = document["rows"]
    most = max(r["critical_ms"] for r in rows)
    ax.plot([0, most], [0, most], ":", color=GREY, linewidth=1.2, label="the draft's GPU work alone")
    for mode, color, label in (("queued", GREEN, "queued: the hosts only launch"),
                               ("synced", ORANGE, "each host awaits each message")):
        line = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["critical_ms"])
        ax.plot([r["critical_ms"] for r in line], [r["wait_ms"] for r in line], "o-", color=color,
                label=label)
    style_ax(ax, title or f"rounds through NCCL, the target's pass {rows[0]['target_ms']} ms", grid_axis="y")
    ax.set_ylabel("the target's wait (ms)")
    ax.set_xlabel("the draft's GPU work between the verdict and the next subtree (ms)")
    ax.legend(frameon=False, fontsize=8.5)
    return ax


def loops_figure(projected: list[dict], ax=None, title: str | None = None):
    """The two loops of a round whose hosts only launch, against d, for the rows with no step after
    the re-root (`parallel_bench.queued_projection`): the target's (its pass, the draft's passes
    between verdict and subtree, the messages) and the draft's (every pass of its round). The round
    is the longer of the two; the fastest d sits near where they cross."""
    line = sorted((p for p in projected if p["critical"] == 0), key=lambda p: p["steps"])
    if not line:
        raise ValueError("no projected row with no step after the re-root")
    ax = new_ax(ax, (5.6, 3.4))
    steps = [p["steps"] for p in line]
    ax.plot(steps, [p["target_loop_ms"] for p in line], "o-", color=BLUE,
            label="the target's loop: its pass, the passes after the verdict")
    ax.plot(steps, [p["draft_loop_ms"] for p in line], "o-", color=ORANGE,
            label="the draft's loop: every pass of its round")
    ax.plot(steps, [p["round_ms"] for p in line], ":", color=INK, linewidth=2.2,
            label="the round: the longer of the two")
    style_ax(ax, title or "a round whose hosts only launch (projected)", grid_axis="y")
    ax.set_xticks(steps)
    ax.set_xlabel("d, the draft's steps during a verification")
    ax.set_ylabel("ms")
    ax.legend(frameon=False, fontsize=8.5)
    return ax


def rank_figure(ahead, size: int, ax=None, title: str | None = None):
    """The selection as a rank count: cell [i, j] is dark when row j is ahead of row i in the order
    (`DeviceTree.ahead`), so that row i's rank is the dark cells of its line, counted for every row
    at once; the rows ranked below `size` (their ranks in orange) are the subtree sent."""
    from matplotlib.colors import ListedColormap

    ahead = to_numpy(ahead).astype(bool)
    if ahead.ndim != 2 or ahead.shape[0] != ahead.shape[1]:
        raise ValueError(f"ahead must be a square (rows, rows) matrix, got shape {ahead.shape}")
    ranks = ahead.sum(axis=1)
    n = len(ranks)
    ax = new_ax(ax, (0.32 * n + 2.6, 0.3 * n + 1.4))
    ax.imshow(ahead, cmap=ListedColormap([HIDDEN, VISIBLE]), vmin=0, vmax=1, aspect="equal")
    cell_grid(ax, n, n)
    index_ticks(ax, n, n)
    for i, rank in enumerate(ranks):
        chosen = rank < size
        ax.text(n - 0.2, i, f"rank {rank}", va="center", fontsize=8,
                color=HIGHLIGHT if chosen else INK, fontweight="bold" if chosen else "normal")
    ax.set_xlabel("row j of the table")
    ax.set_ylabel("row i")
    ax.set_xlim(-0.5, n + 2.2)
    style_ax(ax, title or f"row j ahead of row i: rank = the dark cells of a line; the best {size} sent")
    return ax


# --------------------------------------------------------------------------- measured


def _pick(rows: list[dict], name: str, mode: str, **match) -> list[dict]:
    return [r for r in rows if r["name"] == name and r["mode"] == mode
            and all(r.get(k) == v for k, v in match.items())]


def best_parallel(rows: list[dict], mode: str = "greedy", name: str = "parallel") -> dict:
    """The fastest parallel row of `mode` on the most GPUs measured (two, where there are two),
    whichever transport carried its messages; name "queued": of the queued rounds' rows."""
    parallel = _pick(rows, name, mode)
    if not parallel:
        raise ValueError(f"no {name} rows of mode {mode!r}")
    most = max(r["gpus"] for r in parallel)
    return max((r for r in parallel if r["gpus"] == most), key=lambda r: r["tokens_per_s"])


def comparison(rows: list[dict], mode: str) -> list[tuple[str, dict]]:
    """(label, row) of each method for one mode: plain decoding, the serial decoder, the serial
    schedule, every parallel setup at the best parallel row's d and w, and the queued rounds (the
    hosts only launching: every d measured)."""
    best = best_parallel(rows, mode)
    out = []
    out += [("autoregressive", r) for r in _pick(rows, "autoregressive", mode)]
    for r in _pick(rows, "serial decoder", mode):
        tree = f", {r['tree']} tree, N = {r['N']}" if r.get("tree") else ""
        out.append((f"serial decoder (capstone{tree})", r))
    out += [(f"serial, d = {r['steps']}{_variant(r)}", r)
            for r in _pick(rows, "serial", mode, steps=best["steps"], width=best["width"])]
    for r in _pick(rows, "parallel", mode, steps=best["steps"], width=best["width"]):
        gpus = f"{r['gpus']} GPU" + "s" * (r["gpus"] > 1)
        out.append((f"parallel, d = {r['steps']}{_variant(r)}, {r['transport']}, {gpus}", r))
    for r in _pick(rows, "queued", mode):
        gpus = f"{r['gpus']} GPU" + "s" * (r["gpus"] > 1)
        out.append((f"queued (hosts only launch), d = {r['steps']}, w = {r['width']}, {gpus}", r))
    return out


def _variant(row: dict) -> str:
    """The row's width, growth rule, steps after the re-root and where its draft tree lives, where
    the row says."""
    growth = (f", w = {row['width']}" if row.get("width") else "") + (
        f", growth {row['growth']}" if row.get("growth") else "")
    critical = f", {after_reroot(row['critical'])}" if row.get("critical") else ""
    return growth + critical + (f", {row['draft_tree']} tree" if row.get("draft_tree") else "")


def speed_bars(rows: list[dict], mode: str = "greedy", ax=None, title: str | None = None):
    """tokens/s of each method (`comparison`), each bar labelled with its tokens per target call and
    its speed over the capstone's serial decoder."""
    methods = comparison(rows, mode)
    base = next((r["tokens_per_s"] for label, r in methods if r["name"] == "serial decoder"), None)
    ax = new_ax(ax, (8, 0.5 * len(methods) + 1.2))
    colors = {"autoregressive": GREY, "serial decoder": ORANGE, "serial": ORANGE, "parallel": GREEN,
              "queued": BLUE}
    values = [r["tokens_per_s"] for _, r in methods]
    ax.barh(range(len(methods)), values, color=[colors[r["name"]] for _, r in methods], height=0.6, zorder=2)
    for i, (_, r) in enumerate(methods):
        text = f"{r['tokens_per_s']:.0f} tok/s, {r['tokens_per_call']:.2f} tok/call"
        if base and r["name"] != "serial decoder":
            text += f", {r['tokens_per_s'] / base:.2f}× serial decoder"
        ax.text(r["tokens_per_s"] + 0.01 * max(values), i, text, va="center", fontsize=8.5, color=INK)
    ax.set_yticks(range(len(methods)), [label for label, _ in methods], fontsize=9)
    ax.set_ylim(len(methods) - 0.5, -0.5)
    ax.set_xlim(0, 1.7 * max(values))
    ax.set_xlabel("tokens / s (B = 1)")
    style_ax(ax, title or f"{mode}: tokens per second", grid_axis="x")
    return ax


def measured_figure(document: dict):
    """parallel.png: the measured timelines of the best parallel run, of the same setup with the
    other draft tree or growth rule (where measured) and of the serial schedule at its d and w
    (greedy), and the tokens/s of every method, greedy and sampling, labelled with the device and
    date."""
    import matplotlib.pyplot as plt

    rows = document["rows"]
    best = best_parallel(rows, "greedy")
    same_tree = {"draft_tree": best["draft_tree"]} if "draft_tree" in best else {}
    serial = _pick(rows, "serial", "greedy", steps=best["steps"], width=best["width"], **same_tree)
    same_setup = _pick(rows, "parallel", "greedy", steps=best["steps"], width=best["width"],
                       transport=best["transport"], gpus=best["gpus"])
    # before: the same setup with the other draft tree (else the other growth rule)
    other = ([r for r in same_setup if r.get("draft_tree") != best.get("draft_tree")]
             + [r for r in same_setup if r.get("growth") != best.get("growth")])
    runs = [best] + other[:1] + [r for r in serial[:1] if r.get("timeline")]
    modes = [m for m in ("greedy", "sample") if _pick(rows, "parallel", m)]
    fig = plt.figure(figsize=(13, 2.4 * len(runs) + 2.2 * len(modes)), layout="constrained")
    grid = fig.add_gridspec(len(runs) + len(modes), 1, height_ratios=[1] * len(runs) + [1.3] * len(modes))
    for i, r in enumerate(runs):
        where = f"{r['gpus']} GPU{'s' * (r['gpus'] > 1)}" + (f", {r['transport']}" if r["transport"] else "")
        timeline(r["timeline"], fig.add_subplot(grid[i]),
                 title=f"{r['name']} (d = {r['steps']}{_variant(r)}, {where}): rounds 1-4, greedy")
    for i, mode in enumerate(modes):
        speed_bars(rows, mode, fig.add_subplot(grid[len(runs) + i]))
    fig.suptitle(f"{document.get('gpus', '')} x {document['device']}, {document['date'][:10]}", fontsize=10)
    return fig


FIGURES = {"parallel": measured_figure}
