"""What the single-GPU benchmark (suite.py) writes: the JSON, the performance targets with
PASS/MISS, the printed tables and the chart. Pure functions of the results dict, so they work on
partial results too."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .harness import log

# The performance targets, as ratios from the same run.
GEMM_MIN_RATIO = 0.95        # each plain GEMM >= 0.95x cuBLAS throughput at its shape
FUSED_MAX_TIME = 1.05        # gemm_act / gemm_dact within 5% of a plain cuBLAS GEMM
MLP_MIN_TFLOPS = 700.0       # whole MLP fwd+bwd at swiglu h=14336 (T=8192, d=4096)
MLP_MIN_SPEEDUP = 1.2        # ... and >= 1.2x PyTorch eager
RECOMPUTE_MAX_RATIO = 1.23   # recompute mode <= 1.23x the default mode's time
COLD_START_MAX_S = 2.0       # a second process reaches its first fwd+bwd in <= 2 s
TFLOPS_TARGET_CASE = ("swiglu:14336", 8192, 4096)


# ---- JSON -------------------------------------------------------------------------------------


def _clean(obj):
    """NaN and inf are not JSON: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(results: dict, path: str) -> None:
    """Atomically (write then rename), so a run killed mid-write leaves the previous save."""
    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(results), indent=1, default=str))
    os.replace(tmp, path)


# ---- targets ----------------------------------------------------------------------------------


def _target(kind: str, item: str, value, op: str, goal: float) -> dict:
    if value is None:
        status = "n/a"
    else:
        ok = value >= goal if op == ">=" else value <= goal
        status = "PASS" if ok else "MISS"
    return {"target": kind, "item": item, "measured": value, "goal": f"{op} {goal:g}",
            "status": status}


def _ms_field(m, key):
    return m.get(key) if isinstance(m, dict) and "ms" in m else None


def evaluate_targets(results: dict) -> list[dict]:
    meta = results.get("meta", {})
    out = []
    for row in results.get("gemms", []):
        out.append(_target("GEMM >= 0.95x cuBLAS", f"{row['config']} {row['name']}",
                           row.get("ratio"), ">=", GEMM_MIN_RATIO))
    for row in results.get("fused", []):
        out.append(_target("gemm_act/dact <= 1.05x cuBLAS GEMM time",
                           f"{row['config']} {row['op']}", row.get("time_vs_cublas"), "<=",
                           FUSED_MAX_TIME))
    for row in results.get("mlp", []):
        ours = row.get("variants", {}).get("ours")
        if (row["config"], meta.get("tokens"), meta.get("d_model")) == TFLOPS_TARGET_CASE:
            out.append(_target("MLP swiglu:14336 >= 700 TFLOP/s", row["config"],
                               _ms_field(ours, "tflops"), ">=", MLP_MIN_TFLOPS))
        out.append(_target("MLP >= 1.2x eager", row["config"],
                           _ms_field(ours, "speedup_vs_eager"), ">=", MLP_MIN_SPEEDUP))
        out.append(_target("recompute <= 1.23x default time", row["config"],
                           row.get("recompute_ratio"), "<=", RECOMPUTE_MAX_RATIO))
    cold = results.get("cold_start", {}).get(meta.get("backend"))
    if "cold_start" in results:
        value = cold.get("first_fwd_bwd_s") if isinstance(cold, dict) else None
        out.append(_target("cold start <= 2 s", meta.get("backend", ""), value, "<=",
                           COLD_START_MAX_S))
    return out


# ---- printed tables ---------------------------------------------------------------------------


def num(x, digits: int = 3) -> str:
    """Compact: 778, 12.3, 0.0123; '-' for missing."""
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}g}"


class Notes:
    """Errors as numbered footnotes, so a failed cell stays narrow and the reason is still shown."""

    def __init__(self):
        self.messages: list[str] = []

    def cell(self, m, key: str = "ms", digits: int = 3) -> str:
        if not isinstance(m, dict):
            return num(m, digits) if isinstance(m, (int, float)) else "-"
        if key in m:
            return num(m[key], digits)
        if "unavailable" in m:
            return "n/a"
        reason = m.get("error") or m.get("skipped")
        if reason is None:
            return "-"
        if reason not in self.messages:
            self.messages.append(reason)
        tag = "ERR" if "error" in m else "skip"
        return f"{tag}{self.messages.index(reason) + 1}"

    def lines(self, most: int = 10) -> list[str]:
        out = [f"  [{i + 1}] {msg[:300]}" for i, msg in enumerate(self.messages[:most])]
        if len(self.messages) > most:
            out.append(f"  ... {len(self.messages) - most} more; every message is in the JSON")
        return out


def table(header: list[str], rows: list[list[str]], left: int = 2) -> list[str]:
    """Fixed-width columns: the first ``left`` columns and the last (a status) left-aligned, the
    numbers between them right-aligned."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    last = len(header) - 1

    def fmt(r):
        return "  ".join(c.ljust(w) if i < left or i == last else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return [fmt(header)] + [fmt(r) for r in rows]


def _status(targets: list[dict], kind: str, item: str) -> str:
    for t in targets:
        if t["target"] == kind and t["item"] == item:
            return t["status"]
    return ""


def run_lines(meta: dict, title: str) -> list[str]:
    """A printed report's first lines: what ran, where, and whether ours could run there."""
    lines = [f"{title}  {meta.get('device')}  torch {meta.get('torch')}  {meta.get('dtype')}  "
             f"ours={meta.get('backend')}  git {meta.get('git')}"
             + ("  [DRY RUN: tiny shapes, few iterations; tests the script, not the kernels]"
                if meta.get("dry_run") else "")]
    if meta.get("ours_unavailable"):
        lines.append(f"ours ({meta.get('backend')}) cannot run here, rows say n/a: "
                     f"{meta['ours_unavailable'][:300]}")
    if meta.get("backend_note"):
        lines.append(f"note: {meta['backend_note']}")
    return lines


def timing_line(meta: dict) -> str:
    if meta.get("hold_s"):
        return (f"timing: held, each compared variant back to back for {meta['hold_s']:g} s per "
                f"turn, {meta.get('rounds')} turns each (its own clock, as in training)")
    return "timing: call by call, round-robin (one shared clock: compares cycles)"


def _header(results: dict, notes: Notes) -> list[str]:
    meta = results.get("meta", {})
    lines = run_lines(meta, f"parallel_mlp.bench  T={meta.get('tokens')} d={meta.get('d_model')}")
    if "ceiling" in results:  # the cold command times no GPU work and measures none
        start, end = results["ceiling"].get("start"), results["ceiling"].get("end")
        size = start.get("size") if isinstance(start, dict) else None
        lines.append(f"ceiling: cuBLAS {size}^3 GEMM {notes.cell(start, 'tflops')} TFLOP/s at "
                     f"start, {notes.cell(end, 'tflops')} at end ({notes.cell(start)} ms)")
    if "hold_s" in meta:
        lines.append(timing_line(meta))
    return lines


def _gemm_lines(results: dict, notes: Notes) -> list[str]:
    rows = []
    targets = results.get("targets", [])
    for r in results.get("gemms", []):
        rows.append([r["config"], r["name"], f"{r['m']}x{r['n']}x{r['k']}",
                     notes.cell(r.get("cublas"), "tflops"), notes.cell(r.get("ours"), "tflops"),
                     num(r.get("ratio")), notes.cell(r.get("rel_err"), "", 2),
                     _status(targets, "GEMM >= 0.95x cuBLAS", f"{r['config']} {r['name']}")])
    if not rows:
        return []
    header = ["config", "GEMM", "MxNxK", "cuBLAS TF/s", "ours TF/s", "ours/cuBLAS", "rel err",
              ">=0.95"]
    return ["", "GEMMs (throughput; target ours >= 0.95x cuBLAS)"] + table(header, rows, 3)


def _fused_lines(results: dict, notes: Notes) -> list[str]:
    rows = []
    targets = results.get("targets", [])
    for r in results.get("fused", []):
        rows.append([r["config"], r["op"], notes.cell(r.get("cublas")), notes.cell(r.get("eager")),
                     notes.cell(r.get("ours")), num(r.get("time_vs_cublas")),
                     num(r.get("speedup_vs_eager")), notes.cell(r.get("rel_err"), "", 2),
                     _status(targets, "gemm_act/dact <= 1.05x cuBLAS GEMM time",
                             f"{r['config']} {r['op']}")])
    if not rows:
        return []
    header = ["config", "op", "cuBLAS ms", "eager ms", "ours ms", "ours/cuBLAS t",
              "x eager", "rel err", "<=1.05"]
    return ["", "Fused GEMM+activation (time; target ours <= 1.05x the plain cuBLAS GEMM)"] + \
        table(header, rows)


MLP_VARIANT_NAMES = {"ours": "ours", "ours_recompute": "ours recompute",
                     "eager_recompute": "eager checkpointed",
                     "torch_backend": "ParallelMLP torch", "eager": "eager",
                     "compile": "torch.compile", "eager_again": "eager (again)",
                     "setup": "setup"}


def _mlp_lines(results: dict, notes: Notes) -> list[str]:
    rows = []
    targets = results.get("targets", [])
    for r in results.get("mlp", []):
        for name, m in r.get("variants", {}).items():
            flags = ""
            if name == "ours":
                flags = " ".join(f"{short}:{s}" for short, kind in (
                    ("700TF", "MLP swiglu:14336 >= 700 TFLOP/s"), ("1.2x", "MLP >= 1.2x eager"))
                    if (s := _status(targets, kind, r["config"])))
            elif name == "ours_recompute":
                s = _status(targets, "recompute <= 1.23x default time", r["config"])
                flags = f"recompute/default {num(r.get('recompute_ratio'))}" + \
                    (f" (<=1.23 {s})" if s else "")
                if isinstance(m, dict) and m.get("speedup_vs_eager_recompute"):
                    flags += f"; x eager checkpointed {num(m['speedup_vs_eager_recompute'])}"
            errs = "-"
            if isinstance(m, dict) and "rel_err_y" in m:
                errs = f"{num(m['rel_err_y'], 2)}/{num(m['rel_err_dx'], 2)}"
            rows.append([r["config"], MLP_VARIANT_NAMES.get(name, name), notes.cell(m),
                         notes.cell(m, "tflops"), notes.cell(m, "speedup_vs_eager"),
                         notes.cell(m, "peak_mem_gb"), notes.cell(m, "first_step_s"), errs, flags])
    if not rows:
        return []
    header = ["config", "variant", "ms", "TF/s", "x eager", "peak GB", "1st s", "err y/dx",
              "targets"]
    lines = table(header, rows)
    title = ("MLP fwd+bwd at TP=1 (FLOPs 3x(2TdF+2Thd); targets: ours >= 700 TF/s at "
             "swiglu:14336, >= 1.2x eager; recompute <= 1.23x)")
    return ["", title] + lines


def _cold_start_lines(results: dict, notes: Notes) -> list[str]:
    cold = results.get("cold_start")
    if not cold:
        return []
    title = ("Cold start (new process to its first fwd+bwd, model built on the GPU, 2nd run, "
             "kernel cache warm; target <= 2 s)")
    lines = ["", title]
    targets = results.get("targets", [])
    for backend, m in cold.items():
        if isinstance(m, dict) and "first_fwd_bwd_s" in m:
            last = m["runs"][-1]
            s = _status(targets, "cold start <= 2 s", backend)
            # Seconds since launch at each step; the last figure is the first fwd+bwd itself
            # (model and inputs ready to its end): the part the backend's kernels decide.
            steps = [("torch", "torch_import_s"), ("import", "import_s"), ("CUDA ctx", "cuda_init_s"),
                     ("ready", "ready_s"), ("fwd", "first_fwd_s")]
            marks = ", ".join(f"{label} {num(last[k])}" for label, k in steps if k in last)
            meta = m.get("meta_build")
            meta_note = f"; built on meta {num(meta['first_fwd_bwd_s'])} s" if meta else ""
            lines.append(f"  {backend:6s} {m['config']}: {num(m['first_fwd_bwd_s'])} s "
                         f"({marks}; fwd+bwd alone {num(last['first_fwd_bwd_s'] - last['ready_s'])} s; "
                         f"1st run {num(m['runs'][0]['first_fwd_bwd_s'])} s{meta_note}) {s}")
        else:
            lines.append(f"  {backend:6s} {notes.cell(m, 'first_fwd_bwd_s')}")
    return lines


def _summary_lines(results: dict) -> list[str]:
    """One line per target kind: how many rows pass, and the worst measured value."""
    targets = results.get("targets", [])
    kinds = list(dict.fromkeys(t["target"] for t in targets))
    lines = ["", "Targets"]
    for kind in kinds:
        group = [t for t in targets if t["target"] == kind]
        measured = [t for t in group if t["measured"] is not None]
        counts = {s: sum(t["status"] == s for t in group) for s in ("PASS", "MISS", "n/a")}
        worst = ""
        if measured:
            pick = min if group[0]["goal"].startswith(">=") else max
            w = pick(measured, key=lambda t: t["measured"])
            worst = f"worst {num(w['measured'])} ({w['item']})"
        verdict = "PASS" if counts["PASS"] == len(group) else (
            "MISS" if counts["MISS"] else "n/a")
        lines.append(f"  {verdict:4s}  {kind:40s} {counts['PASS']}/{len(group)} pass  {worst}")
    if not targets:
        lines.append("  (nothing measured)")
    return lines


def format_tables(results: dict) -> str:
    notes = Notes()
    lines = _header(results, notes)
    lines += _gemm_lines(results, notes)
    lines += _fused_lines(results, notes)
    lines += _mlp_lines(results, notes)
    lines += _cold_start_lines(results, notes)
    for err in results.get("errors", []):
        notes.cell({"error": err})
    if notes.messages:
        lines += ["", "Errors and skips"] + notes.lines()
    lines += _summary_lines(results)
    return "\n".join(lines)


# ---- chart ------------------------------------------------------------------------------------


def write_png(results: dict, path: str) -> str:
    """Three panels: GEMM ratios, fused-op time ratios, MLP TFLOP/s. Returns a line to log."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no chart: matplotlib is not installed (pip install 'parallel-mlp[bench]')"
    try:
        fig, axes = plt.subplots(3, 1, figsize=(14, 15))
        _bars(axes[0], [(f"{r['config']}\n{r['name']}", r.get("ratio"))
                        for r in results.get("gemms", [])],
              GEMM_MIN_RATIO, "ours / cuBLAS throughput (GEMMs)")
        _bars(axes[1], [(f"{r['config']}\n{r['op']}", r.get("time_vs_cublas"))
                        for r in results.get("fused", [])],
              FUSED_MAX_TIME, "ours time / plain cuBLAS GEMM time (fused ops)")
        _mlp_panel(axes[2], results)
        meta = results.get("meta", {})
        fig.suptitle(f"parallel_mlp.bench - {meta.get('device')} - {meta.get('dtype')} "
                     f"T={meta.get('tokens')} d={meta.get('d_model')}")
        fig.tight_layout()
        return save_figure(fig, path)
    except Exception as e:  # noqa: BLE001 - a chart never costs the numbers
        return f"no chart: {type(e).__name__}: {e}"


def save_figure(fig, path: str) -> str:
    """Write a matplotlib figure as a PNG (making its folder) and free it; a line to log."""
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return f"wrote {path}"


def finish(results: dict, json_path: str, png_path: str | None, draw, tables) -> None:
    """A run's last words: its chart when one was asked for (``draw(results, path)``), where its
    JSON went, and its tables (``tables(results)``) on stdout, last."""
    if png_path:
        log(draw(results, png_path))
    log(f"wrote {json_path}")
    print(tables(results))


def _bars(ax, items, goal, title):
    labels = [label for label, _ in items]
    values = [v if v is not None else 0.0 for _, v in items]
    ax.bar(range(len(values)), values, color="tab:blue")
    # Clip wild outliers (tiny dry-run shapes) so the bars near the target stay readable.
    ax.set_ylim(0, min(max(values + [goal]) * 1.1, 3 * goal))
    ax.axhline(goal, color="tab:red", linestyle="--", label=f"target {goal:g}")
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
    ax.set_title(title)
    ax.legend()


def _mlp_panel(ax, results):
    rows = results.get("mlp", [])
    names = ["ours", "ours_recompute", "torch_backend", "eager", "eager_recompute", "compile"]
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        values = []
        for r in rows:
            m = r.get("variants", {}).get(name)
            values.append(m.get("tflops", 0.0) if isinstance(m, dict) else 0.0)
        ax.bar([i + j * width for i in range(len(rows))], values, width,
               label=MLP_VARIANT_NAMES[name])
    ax.axhline(MLP_MIN_TFLOPS, color="tab:red", linestyle="--", label="700 TFLOP/s")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [r["config"] for r in rows])
    ax.set_ylabel("TFLOP/s")
    ax.set_title("MLP fwd+bwd")
    ax.legend(fontsize=7)
