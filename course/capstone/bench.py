"""The capstone's measurements: `python -m course bench capstone [sections] [options]` on a GPU.

Sections (the options, `add_options`, after them; `--out DIR` writes into DIR instead of results/<device>/):

  decode        (the default) plain, chain and tree decoding side by side, below: capstone.json, each
                row saved as it is measured (its figures: `python -m course figures capstone`);
  graphs        a minute's check before the long run: the graphed decoders capture, replay and emit
                what the eager ones emit (`graphs_check`; its rows only into --out);
  step_profile  one draft step, kernel by kernel (`step_profile`): step_profile.json;
  parallel      serial against parallel tree generation on two GPUs (`parallel_bench`, notebook 20):
                results/<device>x2/parallel.json and its figure.

The medium pair (`weights.load_pair("medium")`: a 12-layer target, a 1-layer draft), in float16,
decodes held-out prompts (`prompts`) for MAX_NEW tokens each with the course's kernels (solutions/;
in a hand-out without solutions/, the student's lessons/), at B = 1 and B = 4 prompts, greedy and
sampling, by three methods side by side, each built once (`decoder.PlainDecoder` /
`SpeculativeDecoder`: static buffers, every step a CUDA graph):

  "autoregressive"  plain decoding with the target alone (the baseline, on the same machinery);
  "chain"           chain speculative decoding (Leviathan et al.): k drafted tokens, one path
                    (width = branch = 1, tree_size = k + 1, k draft steps), k in CHAINS;
  "tree"            tree speculative decoding (SpecInfer, SwiftSpec's growth), settings in TREES.

B = 1 greedy sweeps every chain and tree; the other batches and modes measure the baseline, the
fastest chain and the fastest tree of that sweep.

Row fields (the shared schema): name (the method), B, H (target query heads), N (tree_size; 1 for
the baseline), d (head dim), median_ms (the median over REPEATS generations, after a warm-up one),
max_abs_err (greedy: the fraction of generated tokens that differ from plain greedy decoding with
the same target, 0.0 when exact; in float16 a near-tie between two logits can break differently in
a pass of many queries and in a plain step, and the outputs then diverge; sampling: 0.0, nothing to
compare token by token), and: figure ("speed"), mode, pair, graphs, tree_size, width, branch, steps,
tokens_per_s, tokens_per_call (emitted per sample per target call: tau), accepted_per_call,
target_calls, draft_calls, new_tokens, identical (greedy: the whole output equals the baseline's),
speedup (tokens/s over the baseline of the same B and mode), and the terms of the speed-up formula
from a separate timed generation with CUDA events between the phases (`PhaseClock`): t_plain_ms
(the baseline's step), t_draft_ms (one draft step), t_verify_ms (the target pass and verification),
t_commit_ms (compaction, re-rooting, bookkeeping), t_wait_ms (the GPU idle while the host reads the
round's result and launches the next), and predicted_speedup = tau * t_plain / (steps * t_draft +
t_verify + t_commit + t_wait). Chain rows also hold alpha (the per-token acceptance rate, estimated
from the accepted counts) and leviathan_tokens_per_call = (1 - alpha^(k+1)) / (1 - alpha), Leviathan
et al.'s expected tokens per call, beside the measured tau.

Figure "timeline" rows: one round of the fastest B = 1 greedy tree, and plain steps, with and
without graphs ("before": every kernel launched from Python), each phase's start and end on the GPU
(CUDA events) and its kernel count (torch.profiler).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from course.core import impl as course_impl
from course.core import runtime

SUITE = "capstone"
PAIR = "medium"
BATCHES = (1, 4)
MAX_NEW = 256
PROMPT_CHARS = 48
REPEATS = 5
CHAINS = (3, 4, 5, 6, 8, 10, 12)  # k drafted tokens
# The tree shapes of `course.capstone.shapes`, each at a few budgets: "fixed" the capstone's first tree
# (tree_size, width, branch, steps); "sequoia" (budget, depth limit); "dynamic" (tree_size, width,
# branch, steps).
SEQUOIA = ((16, 8), (32, 8), (48, 8), (48, 12), (64, 12))
DYNAMIC = ((32, 4, 4, 8), (48, 4, 4, 10), (48, 6, 2, 12), (64, 4, 2, 12))
# Modes as (mode, temperature): greedy, and sampling at T = 1 and 0.6.
MODES = (("greedy", 1.0), ("sample", 1.0), ("sample", 0.6))
DEFAULT_TREE = (16, 2, 4, 6)  # notebook 19's first tree
PROMPT_SEED = 7  # held-out text: training used seed 1, the held-out loss seed 2
BUDGET_S = 300.0  # the whole measurement; settings past it are recorded as not measured


def prompts(batch: int = 4, chars: int = PROMPT_CHARS, seed: int = PROMPT_SEED) -> list[str]:
    """`batch` prompts of `chars` characters: the starts of lines of freshly generated text."""
    from .text import corpus

    lines = [line for line in corpus(200 * batch * chars, seed).split("\n") if len(line) >= chars]
    if len(lines) < batch:
        raise ValueError(f"could not find {batch} lines of {chars} characters")
    return [line[:chars] for line in lines[:batch]]


# --------------------------------------------------------------------------- timing a round's phases


class PhaseClock:
    """The decoder loop's clock (`Decoder.generate(clock=...)`): a CUDA event before every phase (on
    a CPU, the host's clock). After the generation, `phases()` gives each phase's (name, start_ms,
    end_ms) on the device from the first mark, where a phase ends when the next one starts."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def __call__(self, phase: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        else:
            event = time.perf_counter()
        self.marks.append((phase, event))

    def phases(self) -> list[tuple[str, float, float]]:
        if self.cuda:
            torch.cuda.synchronize()
            first = self.marks[0][1]
            times = [first.elapsed_time(event) for _, event in self.marks]
        else:
            times = [1e3 * (t - self.marks[0][1]) for _, t in self.marks]
        return [(name, times[i], times[i + 1]) for i, (name, _) in enumerate(self.marks[:-1])]


def rounds_of(phases: list[tuple[str, float, float]]) -> list[list[tuple[str, float, float]]]:
    """Phases grouped by round: a round starts at a "draft" that follows a "wait" (or the first)."""
    rounds: list[list] = []
    for phase in phases:
        if phase[0] == "draft" and (not rounds or rounds[-1][-1][0] == "wait"):
            rounds.append([])
        rounds[-1].append(phase)
    return rounds


def phase_means(phases) -> dict[str, float]:
    """Mean duration (ms) of each kind of phase."""
    totals: dict[str, list[float]] = {}
    for name, start, end in phases:
        totals.setdefault(name, []).append(end - start)
    return {name: sum(v) / len(v) for name, v in totals.items()}


def count_kernels(run) -> int | None:
    """Kernels that run() launches (torch.profiler's CUDA activity), or None without a GPU or if the
    profiler fails."""
    if not torch.cuda.is_available():
        return None
    try:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and "memcpy" not in e.name.lower() and "memset" not in e.name.lower())
    except Exception as error:  # the profiler is optional: the bench goes on without the count
        print(f"kernel count unavailable: {error}", flush=True)
        return None


# --------------------------------------------------------------------------- one setting


def mismatch(got: list[list[int]], want: list[list[int]]) -> float:
    total = sum(len(w) for w in want)
    wrong = sum(sum(a != b for a, b in zip(g, w, strict=False)) + abs(len(g) - len(w))
                for g, w in zip(got, want, strict=True))
    return wrong / max(total, 1)


def _median_run(decoder, encoded, max_new: int, repeats: int):
    """A warm-up generation, then the median of `repeats` (every figure of a row comes from it)."""
    decoder.generate(encoded, max_new, seed=0)
    runs = sorted((decoder.generate(encoded, max_new, seed=1 + i) for i in range(repeats)),
                  key=lambda g: g.seconds)
    return runs[(len(runs) - 1) // 2]


def chain_alpha(accepted: list[list[int]], k: int) -> float:
    """The per-token acceptance rate of a chain of k drafts, from the accepted counts per round: a
    round stops at its first rejection unless all k are accepted, so alpha = accepted tokens /
    (accepted tokens + rounds that stopped at a rejection) (the maximum-likelihood estimate for
    independent acceptances, Leviathan et al. §3.1's beta)."""
    counts = [a for per in accepted for a in per]
    tried = sum(counts) + sum(1 for a in counts if a < k)
    return sum(counts) / tried if tried else 0.0


def leviathan_tokens(alpha: float, k: int) -> float:
    """Expected tokens per call of a chain of k drafts with acceptance rate alpha (Leviathan §3.1)."""
    return k + 1.0 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


class Bench:
    """The measurement of one pair: the methods side by side, rows written as they come."""

    def __init__(self, pair, out: Path | None, budget_s: float, max_new: int = MAX_NEW,
                 repeats: int = REPEATS, log=print, backend: str = "kernels", drafts=None, modes=MODES):
        self.pair, self.out, self.budget_s = pair, out, budget_s
        self.max_new, self.repeats, self.log, self.backend = max_new, repeats, log, backend
        self.impl = course_impl.bench_impl()
        self.rows: list[dict] = []
        self.started = time.perf_counter()
        self.plain: dict[tuple, dict] = {}  # (B, mode, temperature) -> the baseline's row and tokens
        target = pair.target
        self.base = dict(H=target.config.n_heads, d=target.config.head_dim, pair=pair.name)
        self.drafts = drafts or [("final", pair.draft)]  # (label, draft), the final draft last
        self.modes = modes

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def save(self) -> None:
        if self.out is not None:
            from course.measure import results

            results.save(SUITE, self.rows, self.out)

    def add(self, row: dict) -> dict:
        self.rows.append(row)
        self.save()
        shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                 if k in ("name", "tree", "draft", "B", "mode", "temperature", "tree_size", "width", "branch",
                          "steps", "tokens_per_s", "tokens_per_call", "speedup", "predicted_tokens_per_call",
                          "identical", "error", "rates")}
        self.log(f"[{self.elapsed():6.1f} s] {json.dumps(shown)}")
        return row

    def encoded(self, batch: int) -> list[list[int]]:
        from .text import encode

        return [encode(t) for t in prompts(batch)]

    def _failed(self, settings: dict, error: BaseException | str) -> dict:
        return self.add(dict(self.base, **settings, figure="speed", median_ms=None, max_abs_err=None,
                             error=str(error)[:500]))

    def measure(self, name: str, batch: int, mode: str, tree: dict | None = None, *,
                temperature: float = 1.0, draft: str = "final", shape: str | None = None,
                predicted: float | None = None) -> dict | None:
        """One setting's row (an "error" row if it fails or the budget is spent). tree: the decoder's
        settings (tree_size, width, branch, steps, and key, bias, replacement when not the defaults);
        shape: which of `shapes.TREES` it is; predicted: the dynamic program's tokens per call."""
        settings = dict(name=name, B=batch, mode=mode, temperature=temperature, draft=draft)
        if tree is not None:
            settings.update({k: tree[k] for k in ("tree_size", "width", "branch", "steps")})
            settings.update(tree=shape or name, replacement=tree.get("replacement", False))
            if predicted is not None:
                settings["predicted_tokens_per_call"] = predicted
        if self.elapsed() > self.budget_s:
            return self._failed(settings,
                                f"not measured: the bench's time budget ({self.budget_s:.0f} s) was spent")
        try:
            return self._measure(settings, name, batch, mode, tree)
        except Exception as error:  # one setting's failure must not lose the others
            import traceback

            traceback.print_exc()
            return self._failed(settings, f"{type(error).__name__}: {error}")

    def _draft(self, label: str):
        return dict(self.drafts)[label]

    def _build(self, name: str, batch: int, mode: str, tree: dict | None, graphs=None, *, temperature=1.0,
               draft: str = "final"):
        from .decoder import PlainDecoder, SpeculativeDecoder

        max_len = PROMPT_CHARS + self.max_new
        options = dict(batch=batch, max_len=max_len, mode=mode, backend=self.backend, impl=self.impl,
                       graphs=graphs, temperature=temperature)
        if name == "autoregressive":
            return PlainDecoder(self.pair.target, **options)
        return SpeculativeDecoder(self.pair.target, self._draft(draft), **tree, **options)

    def _measure(self, settings: dict, name: str, batch: int, mode: str, tree: dict | None) -> dict:
        encoded = self.encoded(batch)
        temperature, draft = settings["temperature"], settings["draft"]
        t0 = time.perf_counter()
        decoder = self._build(name, batch, mode, tree, temperature=temperature, draft=draft)
        built_s = time.perf_counter() - t0
        gen = _median_run(decoder, encoded, self.max_new, self.repeats)
        clock = PhaseClock(decoder.device)
        decoder.generate(encoded, self.max_new, seed=0, clock=clock)
        means = phase_means(clock.phases())
        row = dict(self.base, **settings, figure="speed", graphs=decoder.graphs, median_ms=1e3 * gen.seconds,
                   tokens_per_s=gen.tokens_per_s, tokens_per_call=gen.tokens_per_call,
                   accepted_per_call=gen.accepted_per_call, target_calls=gen.target_calls,
                   draft_calls=gen.draft_calls, new_tokens=gen.new_tokens, build_s=built_s)
        if name == "autoregressive":
            row.update(N=1, t_plain_ms=means["step"], max_abs_err=0.0, speedup=1.0)
            self.plain[(batch, mode, temperature)] = dict(row=row, tokens=gen.tokens)
            return self.add(row)
        plain = self.plain.get((batch, mode, temperature))
        steps = tree["steps"]
        row.update(N=tree["tree_size"], t_draft_ms=means["draft"], t_verify_ms=means["verify"],
                   t_commit_ms=means["commit"], t_wait_ms=means.get("wait", 0.0))
        round_ms = steps * means["draft"] + means["verify"] + means["commit"] + means.get("wait", 0.0)
        row["round_ms"] = round_ms
        if plain is not None:
            p = plain["row"]
            row.update(speedup=gen.tokens_per_s / p["tokens_per_s"], t_plain_ms=p["t_plain_ms"],
                       predicted_speedup=gen.tokens_per_call * p["t_plain_ms"] / round_ms)
        if mode == "greedy" and plain is not None:
            row.update(max_abs_err=mismatch(gen.tokens, plain["tokens"]),
                       identical=gen.tokens == plain["tokens"])
        else:
            row["max_abs_err"] = 0.0
        if name == "chain":
            alpha = chain_alpha(gen.accepted, steps)
            row.update(alpha=alpha, leviathan_tokens_per_call=leviathan_tokens(alpha, steps))
        return self.add(row)

    def timeline(self, tree: dict) -> None:
        """One round of the tree (B = 1, greedy) and plain steps, graphed and eager, phase by phase."""
        encoded = self.encoded(1)
        lanes = (True, False) if self.pair.target.device.type == "cuda" else (False,)  # graphs need a GPU
        for name, setting in (("tree", tree), ("autoregressive", None)):
            for graphs in lanes:
                if self.elapsed() > self.budget_s:
                    return
                try:
                    self._timeline(name, setting, graphs, encoded)
                except Exception as error:  # the figure is optional; the speed rows are not
                    import traceback

                    traceback.print_exc()
                    self.log(f"timeline {name} graphs={graphs} failed: {error}")

    def _timeline(self, name, tree, graphs: bool, encoded) -> None:
        decoder = self._build(name, 1, "greedy", tree, graphs=graphs)
        decoder.generate(encoded, self.max_new)  # warm-up
        clock = PhaseClock(decoder.device)
        gen = decoder.generate(encoded, self.max_new, clock=clock)
        phases = clock.phases()
        # The kernels of each phase, counted when they are launched one by one (the graphs run the same).
        count = count_kernels if not graphs else (lambda run: None)
        if name == "tree":
            rounds = rounds_of(phases)
            inner = rounds[1:-1] or rounds  # not the first round (the generation's start) nor the last
            middle = sorted(inner, key=lambda r: r[-1][2] - r[0][1])[len(inner) // 2]  # the median round
            kernels = {"draft": count(decoder.draft_steps[-1]), "verify": count(decoder.verify),
                       "commit": count(decoder.commit)}
            settings = {k: tree[k] for k in ("tree_size", "width", "branch", "steps")}
        else:
            middle = phases[len(phases) // 2:len(phases) // 2 + 1]  # one step from the middle
            kernels = {"step": count(decoder.step)}
            settings = {}
        origin = middle[0][1]
        want = self.plain.get((1, "greedy", 1.0))
        err = mismatch(gen.tokens, want["tokens"]) if want else 0.0
        self.add(dict(self.base, name=name, B=1, mode="greedy", figure="timeline", graphs=graphs, **settings,
                      N=settings.get("tree_size", 1), median_ms=middle[-1][2] - origin, max_abs_err=err,
                      phases=[[n, s - origin, e - origin] for n, s, e in middle], means=phase_means(phases),
                      kernels=kernels, tokens_per_s=gen.tokens_per_s, tokens_per_call=gen.tokens_per_call))

    # ------------------------------------------------------------------ the sweep

    def acceptance(self, draft: str, mode: str, temperature: float) -> list[float]:
        """The draft's acceptance vector (`shapes.acceptance`), recorded as an "acceptance" row."""
        from . import shapes
        from .weights import Pair

        pair = Pair(self.pair.target, self._draft(draft), self.pair.name)
        rates = shapes.acceptance(pair, mode, temperature)
        self.add(dict(self.base, name="acceptance", figure="acceptance", statistic="acceptance", draft=draft,
                      mode=mode, temperature=temperature, B=1, N=1, median_ms=None, max_abs_err=None,
                      rates=rates))
        return rates

    def _best(self, name: str, batch: int, mode: str, temperature: float, draft: str,
              tree: str | None = None) -> dict | None:
        found = [r for r in self.rows if r.get("figure") == "speed" and r.get("tokens_per_s")
                 and r["name"] == name and r["B"] == batch and r["mode"] == mode
                 and r.get("temperature") == temperature and r.get("draft") == draft
                 and (tree is None or r.get("tree") == tree)]
        return max(found, key=lambda r: r["tokens_per_s"]) if found else None

    def sweep(self, draft: str, mode: str, temperature: float, batch: int = 1) -> dict:
        """Plain, every chain and every tree shape of one draft and mode; the fastest settings of each."""
        from . import shapes

        rates = self.acceptance(draft, mode, temperature)
        where = dict(temperature=temperature, draft=draft)
        if (batch, mode, temperature) not in self.plain:
            self.measure("autoregressive", batch, mode, **where)
        for k in CHAINS:
            self.measure("chain", batch, mode, dict(tree_size=k + 1, width=1, branch=1, steps=k), **where)
        fixed = dict(zip(("tree_size", "width", "branch", "steps"), shapes.FIXED, strict=True))
        self.measure("tree", batch, mode, fixed, shape="fixed", **where)
        if mode == "sample":  # SpecInfer's siblings, drawn with replacement, for comparison
            self.measure("tree", batch, mode, dict(fixed, replacement=True), shape="fixed", **where)
        for budget, depth in SEQUOIA:
            try:
                tree = shapes.settings_for("sequoia", rates, mode, tree_size=budget, max_depth=depth)
            except ValueError as error:
                self.log(f"sequoia {budget}/{depth} for {draft} {mode}: {error}")
                continue
            predicted = tree.pop("predicted_tokens_per_call")
            self.measure("tree", batch, mode, tree, shape="sequoia", predicted=predicted, **where)
        for bs, w, k, s in DYNAMIC:
            tree = shapes.settings_for("dynamic", rates, mode, tree_size=bs, width=w, branch=k, steps=s)
            self.measure("tree", batch, mode, tree, shape="dynamic", **where)
        return {"rates": rates}

    def _settings_of(self, row: dict, rates, mode: str) -> dict:
        """The decoder settings that produced a tree row (the sweep's rows hold no bias)."""
        from . import shapes

        if row["tree"] == "sequoia":
            tree = shapes.settings_for("sequoia", rates, mode, tree_size=row["tree_size"],
                                       max_depth=row["steps"])
            tree.pop("predicted_tokens_per_call")
            return tree
        shape = {k: row[k] for k in ("tree_size", "width", "branch", "steps")}
        if row["name"] == "chain":
            return shape
        return dict(shapes.settings_for(row["tree"], rates, mode, **shape), replacement=row["replacement"])

    def run(self) -> list[dict]:
        """B = 1: the final draft, every mode and method; the timeline of the fastest greedy tree; B = 4:
        the final draft's plain, fastest chain and fastest tree of each shape; then B = 1 again for
        each weaker draft (last, so that a spent budget loses those first)."""
        final = self.drafts[-1][0]
        rates = {(mode, t): self.sweep(final, mode, t)["rates"] for mode, t in self.modes}
        best = self._best("tree", 1, "greedy", 1.0, final) if ("greedy", 1.0) in rates else None
        if best is not None:
            self.timeline(self._settings_of(best, rates[("greedy", 1.0)], "greedy"))
        for mode, temperature in self.modes:
            where = dict(temperature=temperature, draft=final)
            self.measure("autoregressive", 4, mode, **where)
            for name, shape in (("chain", None), ("tree", "fixed"), ("tree", "sequoia"), ("tree", "dynamic")):
                row = self._best(name, 1, mode, temperature, final, shape)
                if row is not None:
                    tree = self._settings_of(row, rates[(mode, temperature)], mode)
                    self.measure(name, 4, mode, tree, shape=shape, **where)
        for mode, temperature in self.modes:
            for label, _ in reversed(self.drafts[:-1]):
                self.sweep(label, mode, temperature)
        return self.rows


def drafts_of(name: str, dtype=torch.float16) -> list[tuple[str, object]]:
    """(label, draft) of pair `name`: its snapshots ("50 steps", ...) then the final draft ("final")."""
    from . import weights

    drafts = weights.load_drafts(name, dtype=dtype)
    return [(label, d) for label, d in drafts[:-1]] + [("final", drafts[-1][1])]


# --------------------------------------------------------------------------- python -m course bench capstone
# The command's sections (`course.benchcli`): decode (the default) writes capstone.json; the
# others write files of their own (`SAVED_APART`). Every section gets every option (`add_options`) and
# takes the ones it uses.

DEFAULT_SECTIONS = ("decode",)
DEFAULT_MODES = "greedy,sample:1.0,sample:0.6"


def add_options(parser) -> None:
    """The capstone bench's options, after its sections on the command line."""
    parser.add_argument("--pair", default=None,
                        help=f"the trained pair (default {PAIR}; the graphs section: small, which needs no "
                             "training)")
    parser.add_argument("--budget", type=float, default=BUDGET_S,
                        help="decode: seconds for the whole measurement")
    parser.add_argument("--until", type=float, default=None,
                        help="decode: a wall-clock deadline (seconds since the epoch); the budget ends 20 s "
                             "before")
    parser.add_argument("--max-new", type=int, default=None, help="decode and parallel: tokens per prompt")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="decode: timed generations per setting")
    parser.add_argument("--modes", default=DEFAULT_MODES,
                        help="greedy and sample:TEMPERATURE, comma-separated (step_profile and parallel: the "
                             "modes alone)")
    parser.add_argument("--final-draft-only", action="store_true", help="decode: not the draft's snapshots")
    parser.add_argument("--one-gpu", action="store_true", help="parallel: also both processes sharing cuda:0")
    parser.add_argument("--smoke", action="store_true",
                        help="parallel: a quick pass (one prompt, 16 tokens, d = 2), saved only into --out")


def modes_of(text: str) -> list[tuple[str, float]]:
    """--modes as (mode, temperature): "greedy,sample:0.6" -> [("greedy", 1.0), ("sample", 0.6)]."""
    modes = []
    for word in text.split(","):
        mode, _, temperature = word.partition(":")
        if mode not in ("greedy", "sample") or (mode == "greedy" and temperature):
            raise ValueError(f"--modes must be greedy and sample:TEMPERATURE, comma-separated; got {word!r}")
        modes.append((mode, float(temperature or 1.0)))
    return modes


def mode_names(text: str) -> tuple[str, ...]:
    """The modes of --modes without their temperatures, each once, in order."""
    return tuple(dict.fromkeys(mode for mode, _ in modes_of(text)))


def decode_section(*, pair=None, budget=BUDGET_S, until=None, max_new=None, repeats=REPEATS,
                   modes=DEFAULT_MODES, final_draft_only=False, smoke=False, out=None,
                   **others) -> list[dict]:
    """The side-by-side measurement of the module docstring, within `budget` seconds (or until the
    deadline `until`); each row is saved as soon as it is measured, so that a run stopped at its
    deadline keeps what it measured."""
    from course.measure import results

    from . import weights

    if smoke:
        raise ValueError("--smoke is the parallel section's quick pass; the decode section's is the graphs "
                         "section (`python -m course bench capstone graphs`)")
    if until is not None:
        budget = min(budget, until - time.time() - 20)
    name = pair or PAIR
    loaded = weights.load_pair(name, dtype=torch.float16)
    drafts = [("final", loaded.draft)] if final_draft_only else drafts_of(name)
    folder = out or results.RESULTS / results.device_folder(runtime.device_name())
    print(f"capstone bench: pair {name}, {runtime.device_name()}, budget {budget:.0f} s", flush=True)
    return Bench(loaded, folder, budget, max_new or MAX_NEW, repeats, drafts=drafts,
                 modes=modes_of(modes)).run()


def graphs_section(*, pair=None, out=None, **others) -> list[dict]:
    """A minute's check before the long run (`graphs_check`): the graphed decoders against the eager ones."""
    from . import graphs_check

    return graphs_check.rows(pair or "small")


def step_profile_section(*, pair=None, modes=DEFAULT_MODES, **others) -> list[dict]:
    """Where a draft step's time goes, kernel by kernel (`step_profile`)."""
    from . import step_profile

    return step_profile.rows(pair or PAIR, mode_names(modes))


def parallel_section(*, pair=None, max_new=None, modes=DEFAULT_MODES, one_gpu=False, smoke=False,
                     **others) -> list[dict]:
    """Serial against parallel tree generation, on two GPUs (`parallel_bench`, notebook 20)."""
    from . import parallel_bench

    options = dict(pair=pair or parallel_bench.PAIR, max_new=max_new or parallel_bench.MAX_NEW,
                   one_gpu=one_gpu, modes=mode_names(modes))
    if smoke:
        options.update(n_prompts=1, max_new=16, steps=(2,), repeats=1)
    return parallel_bench.measure(**options)


def _save_graphs(rows: list[dict], options: dict) -> Path | None:
    """The check's rows go into --out only: they are not a measurement of the course."""
    from course.measure import results

    return results.save("capstone_graphs", rows, options["out"]) if options["out"] else None


def _save_step_profile(rows: list[dict], options: dict) -> Path:
    from course.measure import results

    from . import step_profile

    return results.save(step_profile.SUITE, rows, options["out"])


def _save_parallel(rows: list[dict], options: dict) -> Path | None:
    """results/<device>x2/parallel.json and its figure (`parallel_bench.save`); a quick pass only into
    --out."""
    from . import parallel_bench

    if options["smoke"] and options["out"] is None:
        return None
    return parallel_bench.save(rows, min(torch.cuda.device_count(), 2), options["out"])


SECTIONS = {"decode": decode_section, "graphs": graphs_section, "step_profile": step_profile_section,
            "parallel": parallel_section}
SAVED_APART = {"graphs": _save_graphs, "step_profile": _save_step_profile, "parallel": _save_parallel}


def section_of(row: dict) -> str:
    """Every row of capstone.json comes from the decode section."""
    return "decode"
