"""What the shape sweep writes besides its JSON: the printed table with its summary, and heat maps
of ours / eager and ours / quack over (T, d). Pure functions of the results dict, so they work on
partial results too."""

from __future__ import annotations

import math
import textwrap

from .harness import ratio, ratio_interval, round_ratios
from .report import Notes, num, run_lines, save_figure, table, timing_line
from .threads import describe

VARIANT_NAMES = {"ours": "ours", "ours_fused": "ours, fused kernels",
                 "ours_recompute": "ours recompute", "eager": "eager",
                 "eager_recompute": "eager, checkpointed",
                 "compile": "torch.compile", "quack": "quack",
                 "torch_backend": "ours, torch backend",
                 "ours_cute": "ours, every GEMM on our kernels", "eager_graphed": "eager, CUDA graph",
                 "ours_graphed": "ours, CUDA graph", "eager_copy": "eager, a second copy",
                 "gemm_ceiling": "six cuBLAS GEMMs, no act"}
# Against whom ours' summary and heat maps compare it: (variant, key of ours' ratio, label).
BASELINES = (("eager", "speedup_vs_eager", "eager"), ("compile", None, "torch.compile"),
             ("quack", "speedup_vs_quack", "quack"))


def _ms(m) -> float | None:
    return m.get("ms") if isinstance(m, dict) else None


def ours_over(row: dict, baseline: str, variant: str = "ours") -> float | None:
    """baseline's time / ours' (default mode, or the variant named) at this row, paired round by
    round where both were held side by side (harness.ratio): > 1 where ours is faster."""
    v = row.get("variants", {})
    ours, base = v.get(variant), v.get(baseline)
    return ratio(base, ours) if _ms(ours) and _ms(base) else None


def _header(results: dict) -> list[str]:
    meta = results.get("meta", {})
    lines = run_lines(meta, "parallel_mlp.bench sweep") + [timing_line(meta)]
    short = sorted({(t["hold_s"], t["rounds"]) for r in results.get("rows", [])
                    if isinstance(t := r.get("turns"), dict)})
    if short:
        lines.append("  host-bound steps (less GPU work than the host's launches): " + "; ".join(
            f"{h:g} s x {n} turns" for h, n in short) + " in the same time (the host's speed "
            "wanders over seconds)")
    if meta.get("autograd_threads") is False:
        lines.append("autograd device threads off: every backward ran on the calling thread "
                     "(torch.autograd.set_multithreading_enabled(False))")
    if meta.get("launch_graphs") is False:
        lines.append("launch graphs off: ours launched kernel by kernel "
                     "(PARALLEL_MLP_LAUNCH_GRAPHS=0 or --no-launch-graphs)")
    quack = meta.get("quack") or {}
    if quack.get("unavailable"):
        lines.append(f"quack: skipped: {quack['unavailable']}")
    elif "quack" in meta.get("variants", ()):
        mode = "tuned=True (its default: autotuned per shape)" if quack.get("tuned") else \
            "tuned=False (its heuristic config; ours is untuned too)"
        lines.append(f"quack {quack.get('version')}: quack.mlp.MLP, {mode}")
    lines.append("x eager, x quack: eager's (quack's) time / this variant's, > 1 where it is "
                 "faster; step GB: the step's peak above what was allocated before it")
    probe = {k: v for k, v in (meta.get("host_probe_us") or {}).items() if v is not None}
    if probe:
        lines.append("host speed (µs per fwd+bwd of a tiny eager MLP, all host time): " + ", ".join(
            f"{v:.0f} {k}" for k, v in probe.items()))
    where = {k: v for k, v in (meta.get("host_placement") or {}).items() if v}
    if where:
        lines.append("where the main thread and autograd's CUDA thread last ran, at each probe: "
                     + "; ".join(f"{k}: {describe(v)}" for k, v in where.items()))
    return lines


def _rows(results: dict, notes: Notes) -> list[list[str]]:
    rows = []
    for r in results.get("rows", []):
        label = r.get("label", "?")
        if "variants" not in r:  # skipped, or failed before any variant ran
            rows.append([label, "-", notes.cell(r)] + [""] * 5)
            continue
        first = True
        for name, m in r["variants"].items():
            errs = "-"
            if isinstance(m, dict) and "rel_err_y" in m:
                errs = f"{num(m['rel_err_y'], 2)}/{num(m['rel_err_dx'], 2)}"
                if name in r.get("disagree", ()):
                    errs += " !"
            shown = VARIANT_NAMES.get(name, name)
            if name == "ours" and r.get("ours_path") == "small step":
                shown = "ours, small step"
            rows.append([label if first else "", shown, notes.cell(m),
                         notes.cell(m, "tflops"), notes.cell(m, "speedup_vs_eager"),
                         notes.cell(m, "speedup_vs_quack"), notes.cell(m, "peak_over_start_gb"),
                         errs])
            first = False
    return rows


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in values) / len(values))


def _spread(pairs: list[tuple[float, str]]) -> str:
    """'geomean ..x   worst ..x (shape)   best ..x (shape)   N shapes' of (ratio, shape) pairs."""
    lo, hi = min(pairs), max(pairs)
    return (f"geomean {geomean([x for x, _ in pairs]):.3f}x   worst {lo[0]:.3f}x ({lo[1]})   "
            f"best {hi[0]:.3f}x ({hi[1]})   {len(pairs)} shapes")


def summary(results: dict) -> list[str]:
    """Per baseline: the geometric mean of ours' ratios over the shapes, and the worst and best
    shapes; recompute's cost; the rows whose outputs disagree with eager's."""
    rows = [r for r in results.get("rows", []) if "variants" in r]
    lines = ["", "Summary: ours (default mode) against each baseline, its time / ours, "
             "over the shapes"]
    for name, _, label in BASELINES:
        pairs = [(x, r["label"]) for r in rows if (x := ours_over(r, name)) is not None]
        lines.append(f"  vs {label:14s} {_spread(pairs) if pairs else '-'}")
    lines += (noise(rows) + intervals(rows) + rounds_apart(rows) + ceiling(rows) + small_steps(rows)
              + backend_choice(rows) + plain_gemm_library(rows) + graphed(rows)
              + new_launch_keys(rows))
    rec = [r["recompute_ratio"] for r in rows if r.get("recompute_ratio")]
    if rec:
        lines.append(f"  recompute / default time: geomean {geomean(rec):.3f}, "
                     f"{min(rec):.3f} to {max(rec):.3f}")
    lines += recompute(rows) + memory(rows)
    bad = [f"{r['label']}: {', '.join(r['disagree'])}" for r in rows if r.get("disagree")]
    if bad:
        lines += ["", "Outputs or gradients that disagree with eager's (marked '!'):"] + [f"  {b}" for b in bad]
    return lines


def _against(rows: list[dict], variant: str, lead: str, other: str) -> list[str]:
    """One summary line: ours over ``variant`` where both were timed (geometric mean), and the
    shapes where the variant (``other``: its name and verb, for the reader) was the faster."""
    pairs = [(x, r["label"]) for r in rows if (x := ours_over(r, variant)) is not None]
    if not pairs:
        return []
    slower = [f"{label} ({x:.3f}x)" for x, label in sorted(pairs) if x < 1.0]
    return [f"  {lead}: geomean {geomean([x for x, _ in pairs]):.3f}x over {len(pairs)} shapes; "
            f"{other} faster at {len(slower)}" + (": " + ", ".join(slower) if slower else "")]


def noise(rows: list[dict]) -> list[str]:
    """eager against a second copy of itself, timed in the same turns: how far two runs of the
    same step scatter at each shape, the margin within which ours' ratios are ties."""
    pairs = [(x, r["label"]) for r in rows if (x := ours_over(r, "eager", "eager_copy")) is not None]
    if not pairs:
        return []
    return [f"  eager vs a second copy of itself (the timing's spread): {_spread(pairs)}"]


# (baseline, variant, what the line calls the pair): the pairs intervals() judges. Eager's
# second copy against eager checks the method; quack and the GEMM bound are the other two
# baselines the targets name (ours at or above quack, ours at or below the bound).
INTERVAL_PAIRS = (("eager", "ours", "ours vs eager"),
                  ("eager", "eager_copy", "eager's second copy vs eager"),
                  ("quack", "ours", "ours vs quack"),
                  ("gemm_ceiling", "ours", "ours vs the GEMM bound"))


def intervals(rows: list[dict]) -> list[str]:
    """Where a shape ran enough rounds for harness.ratio_interval (the host-bound steps' many
    short turns, or --rounds 6 and more): each pair of INTERVAL_PAIRS, the variant slower or
    faster than its baseline only where the 95% interval of the paired median leaves out 1.0."""
    lines = []
    for baseline, variant, label in INTERVAL_PAIRS:
        found = {"slower": [], "a tie": [], "faster": []}
        for r in rows:
            v = r["variants"]
            interval = ratio_interval(v.get(baseline), v.get(variant))
            if interval is None:
                continue
            lo, hi = interval
            verdict = "slower" if hi < 1.0 else "faster" if lo > 1.0 else "a tie"
            found[verdict].append(f"{r['label']} ({ratio(v[baseline], v[variant]):.3f}x, "
                                  f"{lo:.3f}-{hi:.3f})")
        n = sum(len(x) for x in found.values())
        if not n:
            continue
        lines.append(f"  {label}, 95% interval over the rounds, at {n} shapes: "
                     + ", ".join(f"{verdict} at {len(x)}" for verdict, x in found.items()))
        lines += [f"    {verdict}: {cell}" for verdict in ("slower", "faster")
                  for cell in found[verdict]]
    return lines


# How far ours' ratio to a baseline may move between a shape's rounds before the summary names
# the shape (rounds_apart). Eager against its own copy, the timing's spread, moved by 0.1-2.8%
# between its two rounds at the H200 sweep's 25 held shapes and by 0.3-4.6% at the H100's (more
# than 3% at 7 of them; 2026-12-06), so the summary lists the copy beside ours.
ROUNDS_APART = 0.03


def rounds_apart(rows: list[dict]) -> list[str]:
    """Where a shape ran too few rounds for an interval (the held turns, two by default): the
    shapes at which ours' ratio to eager or to the GEMM bound, or eager's second copy against
    eager, moved by more than ROUNDS_APART between rounds, with each round's ratio, so that the
    median of rounds that disagree is not read as a verdict. On an H100 the sweep's first shape
    read the bound / ours 1.055 in its first round and 0.961 in its second, eager / its copy
    0.966 and 1.010 (the H100 sweep of 36f7dd8, 2026-12-06, 1.5 s of heat before each shape)."""
    lines = []
    for baseline, variant, label in (("eager", "ours", "ours vs eager"),
                                     ("eager", "eager_copy", "eager's second copy vs eager"),
                                     ("gemm_ceiling", "ours", "ours vs the GEMM bound")):
        apart = []
        for r in rows:
            v = r["variants"]
            if ratio_interval(v.get(baseline), v.get(variant)) is not None:
                continue  # enough rounds for an interval: the median stands
            rounds = round_ratios(v.get(baseline), v.get(variant))
            if len(rounds) >= 2 and max(rounds) > min(rounds) * (1 + ROUNDS_APART):
                apart.append(f"{r['label']} ({', '.join(f'{x:.3f}x' for x in rounds)})")
        if apart:
            lines.append(f"  {label}, rounds more than {ROUNDS_APART:.0%} apart (round by "
                         f"round) at {len(apart)} shapes:")
            lines += [f"    {cell}" for cell in apart]
    return lines


def ceiling(rows: list[dict]) -> list[str]:
    """Where cuBLAS's six GEMMs were timed alone (--ceiling): how far below eager a step with a
    free activation would run (the most that fusing the activation can win), and ours against
    that bound (1.0 where ours hides its activation entirely at cuBLAS's speed)."""
    bound = [(x, r["label"]) for r in rows
             if (x := ours_over(r, "eager", "gemm_ceiling")) is not None]
    if not bound:
        return []
    lines = [f"  the GEMM bound (cuBLAS's six GEMMs, no activation) vs eager: {_spread(bound)}"]
    pairs = [(x, r["label"]) for r in rows if (x := ours_over(r, "gemm_ceiling")) is not None]
    if pairs:
        lines.append(f"  ours vs the GEMM bound: {_spread(pairs)}")
    return lines


def recompute(rows: list[dict]) -> list[str]:
    """Ours in recompute mode against eager, and against eager under torch.utils.checkpoint: the
    same promise (x kept alone for backward), which replays the whole forward."""
    lines = []
    for baseline, label in (("eager", "eager"),
                            ("eager_recompute", "eager checkpointed (x kept alone, as ours)")):
        pairs = [(x, r["label"]) for r in rows
                 if (x := ours_over(r, baseline, "ours_recompute")) is not None]
        if pairs:
            lines.append(f"  ours recompute vs {label}: {_spread(pairs)}")
    return lines


# Whose step peak each of ours' modes is held against: (ours' variant, baseline).
MEMORY_PAIRS = (("ours", "eager"), ("ours", "quack"), ("ours_recompute", "eager"),
                ("ours_recompute", "quack"), ("ours_recompute", "eager_recompute"))


def _peak(m) -> float | None:
    return m.get("peak_over_start_gb") if isinstance(m, dict) else None


def memory(rows: list[dict]) -> list[str]:
    """Per pair of MEMORY_PAIRS, over the shapes where both peaks were read: at how many ours'
    step peak (above what was allocated before the step) is higher, and by how much there."""
    lines = []
    for variant, baseline in MEMORY_PAIRS:
        pairs = [(r["label"], a, b) for r in rows
                 if (a := _peak(r.get("variants", {}).get(variant))) is not None
                 and (b := _peak(r.get("variants", {}).get(baseline))) is not None]
        if not pairs:
            continue
        higher = [f"{label} ({a * 1024:.1f} vs {b * 1024:.1f} MiB)" for label, a, b in pairs
                  if a > b]
        lines.append(f"  step peak, {VARIANT_NAMES[variant]} vs {VARIANT_NAMES[baseline]}: "
                     f"higher at {len(higher)} of {len(pairs)} shapes"
                     + (": " + ", ".join(higher) if higher else ""))
    return lines


def backend_choice(rows: list[dict]) -> list[str]:
    """Where the torch backend was timed (--torch-backend): the shapes at which it beat ours."""
    return _against(rows, "torch_backend", "cute vs the torch backend", "the torch backend is")


def plain_gemm_library(rows: list[dict]) -> list[str]:
    """Where the fused function was also timed with every GEMM on our kernels (--all-cute):
    auto's fused function (its plain GEMMs of few tiles on cuBLAS; ``ours``, or ``ours_fused``
    where auto took the small step) against it, > 1 where cuBLAS's GEMMs made it faster."""
    pairs = []
    for r in rows:
        variant = "ours_fused" if "ours_fused" in r.get("variants", {}) else "ours"
        if (x := ours_over(r, "ours_cute", variant)) is not None:
            pairs.append((x, r["label"]))
    if not pairs:
        return []
    return [f"  auto's fused function vs every GEMM on our kernels: {_spread(pairs)}"]


def small_steps(rows: list[dict]) -> list[str]:
    """Where ours (backend='auto') took the small step (plain autograd ops), its time against the
    fused kernels' at the same shape: > 1 where the rule chose the faster path."""
    return _against(rows, "ours_fused", "small step vs the fused kernels, where auto took it",
                    "the fused kernels are")


def graphed(rows: list[dict]) -> list[str]:
    """Where both were timed CUDA-graphed (--graphed): ours against eager with the host's launches
    gone from both, and what the graph gained each."""
    pairs = [(x, r["label"]) for r in rows
             if (x := ours_over(r, "eager_graphed", "ours_graphed")) is not None]
    if not pairs:
        return []
    lines = [f"  CUDA-graphed, ours vs eager: {_spread(pairs)}"]
    for name, label in (("eager", "eager"), ("ours", "ours")):
        gains = [x for r in rows if (x := ours_over(r, name, f"{name}_graphed")) is not None]
        if gains:
            lines.append(f"  the graph's gain, {label}: geomean {geomean(gains):.3f}x, "
                         f"{min(gains):.3f}x to {max(gains):.3f}x")
    return lines


def new_launch_keys(rows: list[dict]) -> list[str]:
    """The variants whose launch groups met new keys during their timed turns (``per_turn``,
    harness.launch_counts): each such key costs a plain run and, seen again, a capture, which a
    training loop, whose keys settle within its first steps, does not pay; per turn, worst first."""
    found = []
    for r in rows:
        for name, res in r.get("variants", {}).items():
            turn = res.get("per_turn") if isinstance(res, dict) else None
            if turn and (turn.get("captures", 0) or turn.get("plain", 0)):
                found.append((turn.get("captures", 0) + turn.get("plain", 0), r["label"],
                              VARIANT_NAMES.get(name, name), turn))
    if not found:
        return []
    found.sort(key=lambda f: -f[0])
    lines = [f"  launch groups meeting new keys in the timed turns, per turn (captures / plain "
             f"runs / replays), at {len(found)} variant-shapes:"]
    for _, label, name, turn in found[:8]:
        lines.append(f"    {label}, {name}: {turn.get('captures', 0):.1f} / "
                     f"{turn.get('plain', 0):.1f} / {turn.get('replays', 0):.1f}")
    return lines


def format_sweep(results: dict) -> str:
    notes = Notes()
    lines = _header(results)
    header = ["shape", "variant", "ms", "TF/s", "x eager", "x quack", "step GB", "err y/dx"]
    lines += [""] + table(header, _rows(results, notes))
    lines += summary(results)
    for err in results.get("errors", []):
        notes.cell({"error": err})
    if notes.messages:
        lines += ["", "Errors and skips"] + notes.lines()
    return "\n".join(lines)


# ---- heat maps --------------------------------------------------------------------------------


# The heat maps' rows: (baseline, ours' variant, panel title's lead). The recompute row is drawn
# when the results have the checkpointed eager.
HEAT_PANELS = (("eager", "ours", "eager time / ours"), ("quack", "ours", "quack time / ours"),
               ("eager_recompute", "ours_recompute", "eager checkpointed / ours recompute"))


def heat_cells(results: dict, activation: str, baseline: str,
               variant: str = "ours") -> dict[tuple, tuple[float, int]]:
    """(T, d) -> (the worst of ``variant``'s ratios to ``baseline`` over the shapes there, how
    many): several TP shards can share a cell, and the worst is the one to look at."""
    cells: dict[tuple[int, int], list[float]] = {}
    for r in results.get("rows", []):
        x = ours_over(r, baseline, variant) if r.get("act") == activation else None
        if x is not None:
            cells.setdefault((r["tokens"], r["d"]), []).append(x)
    return {key: (min(xs), len(xs)) for key, xs in cells.items()}


def write_heatmap(results: dict, path: str) -> str:
    """One panel per (baseline, activation): eager / ours and quack / ours over (T, d), and eager
    checkpointed / ours recompute where the results have it, coloured about 1 (green: ours
    faster). Returns a line to log."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import TwoSlopeNorm
    except ImportError:
        return "no heat map: matplotlib is not installed (pip install 'parallel-mlp[bench]')"
    try:
        rows = results.get("rows", [])
        acts = list(dict.fromkeys(r["act"] for r in rows))
        tokens = sorted({r["tokens"] for r in rows})
        widths = sorted({r["d"] for r in rows})
        baselines = [(base, variant, lead) for base, variant, lead in HEAT_PANELS
                     if base != "eager_recompute"
                     or any(base in r.get("variants", {}) for r in rows)]
        if not (acts and tokens and widths):
            return "no heat map: no rows"
        fig, axes = plt.subplots(len(baselines), len(acts), squeeze=False, layout="constrained",
                                 figsize=(4.2 * len(acts) + 1.5, 3.6 * len(baselines) + 0.5))
        norm = TwoSlopeNorm(vmin=0.7, vcenter=1.0, vmax=1.3)
        quack_reason = (results.get("meta", {}).get("quack") or {}).get("unavailable")
        for i, (name, variant, lead) in enumerate(baselines):
            for j, act in enumerate(acts):
                ax = axes[i][j]
                cells = heat_cells(results, act, name, variant)
                grid = [[math.nan] * len(widths) for _ in tokens]
                for (t, d), (x, n) in cells.items():
                    grid[tokens.index(t)][widths.index(d)] = x
                    text = f"{x:.2f}" + (f"\nworst of {n}" if n > 1 else "")
                    ax.text(widths.index(d), tokens.index(t), text, ha="center", va="center",
                            fontsize=7)
                image = ax.imshow(grid, cmap="RdYlGn", norm=norm, origin="lower", aspect="auto")
                ax.set_xticks(range(len(widths)), [str(d) for d in widths])
                ax.set_yticks(range(len(tokens)), [str(t) for t in tokens])
                if i == len(baselines) - 1:
                    ax.set_xlabel("d (model width)")
                if j == 0:
                    ax.set_ylabel("T (tokens per rank)")
                ax.set_title(f"{lead}, {act}", fontsize=9)
                if not cells and name == "quack" and quack_reason:
                    text = "quack not measured:\n" + textwrap.fill(quack_reason[:120], 40)
                    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center",
                            fontsize=7)
        fig.colorbar(image, ax=axes, shrink=0.8, label="> 1: ours faster (worst shard per cell)")
        meta = results.get("meta", {})
        # "ours" is the default mode; the panels' titles name recompute mode where they show it
        fig.suptitle(f"parallel_mlp.bench sweep - {meta.get('device')} - {meta.get('dtype')} "
                     f"fwd+bwd")
        return save_figure(fig, path)
    except Exception as e:  # noqa: BLE001 - a chart never costs the numbers
        return f"no heat map: {type(e).__name__}: {e}"
