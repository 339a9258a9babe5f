"""Write an evaluation's files: ``metrics.json``, ``report.md``, ``lengths.png``, ``metrics.png``.

Privacy contract: all four are **private** (mode 600 from creation, like ``*.private.json``):
they describe the held-out real texts — ``metrics.json`` and ``report.md`` hold their path,
SHA-256 and row counts, and every metric is a statistic of them, not a differentially private
release. Publish them (``chmod``) only when the held-out texts are public.

``metrics.json`` is the dict :func:`dplang.evaluation.evaluate_files` returns (NaN and
infinities written as ``null``). ``report.md`` is a human-readable summary: inputs, settings,
how sizes were resolved, one results row per run (Table 2 style, values with 99% Wald
intervals), the mean over runs when there are several, warnings and caveats.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dplang.evaluation.plots import plot_metrics
from dplang.evaluation.registry import RunValue, get_metric
from dplang.release import private_dir

__all__ = ["json_safe", "render_markdown", "write_outputs"]


def json_safe(value: Any) -> Any:
    """JSON-safe copy: NaN/inf → None, tuples → lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _ci(d: dict[str, Any] | None, digits: int = 2, scale: float = 1.0) -> str:
    """``mean ± half_width`` from an interval dict."""
    if not d or d.get("mean") is None:
        return "–"
    mean = d["mean"] * scale
    hw = d.get("half_width")
    if hw is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {hw * scale:.{digits}f}"


def _get(d: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_markdown(result: dict[str, Any]) -> str:
    """The ``report.md`` text of an evaluation result."""
    s = result["settings"]
    metrics = s["metrics"]
    real = result["real"]
    runs = result["runs"]
    lines = ["# dplang evaluation report", ""]
    lines += [f"dplang {result.get('dplang_version', '?')}; metrics: {', '.join(metrics)}; "
              f"n = {s['n']} texts per side; intervals are 99% Wald (x̄ ± {s['z']}·s/√m).", ""]
    lines += ["## Inputs", ""]
    lines.append(f"- real (held-out): `{real['path']}` (sha256 {real['sha256'][:12]}…), column "
                 f"`{s['text_column']}`; {real['blank_rows_skipped']} blank rows skipped"
                 + (f", {real['excluded_references']} reference rows excluded"
                    if real.get("excluded_references") else ""))
    for run in runs:
        m = run.get("manifest") or {}
        desc = ", ".join(f"{k}={_fmt(m.get(k))}" for k in
                         ("epsilon", "delta", "top_k", "batch_size", "max_tokens",
                          "temperature", "model") if k in m)
        lines.append(f"- synthetic: `{run['path']}` ({run['generations_in_file']} generations"
                     + (f"; {desc}" if desc else "; no manifest") + ")")
    lines += ["", "## Sizes", "",
              f"Every comparison uses n = {s['n']} real and n synthetic texts: {s['selection']}. "
              "n is the smallest number of texts any input provides (or `--num`)."
              + (f" Every real text was cut to its first {s['real_max_tokens']} tokens of the "
                 "scoring model's tokenizer (`--real-max-tokens`) before any metric."
                 if s.get("real_max_tokens") else ""), ""]
    specs = [get_metric(name) for name in metrics]
    lines += ["## Settings", ""]
    for spec in specs:
        if spec.describe is not None:
            lines.append(spec.describe(s.get(spec.name)))
    lines.append("")

    columns = [(spec, value) for spec in specs for value in spec.ordered_values()]
    lines += ["## Results", ""]
    header = ["", "ε", "k"] + [value.header for _, value in columns]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    row = ["real (held-out)", "", ""]
    for spec, value in columns:
        interval = _get(real, spec.name, *value.real) if value.real is not None else None
        row.append(_ci(interval, value.digits, value.scale) if value.real is not None else "")
    lines.append("| " + " | ".join(row) + " |")
    for run in runs:
        m = run.get("manifest") or {}
        row = [run["name"], _fmt(m.get("epsilon")), _fmt(m.get("top_k"))]
        row += [_cell(value, run.get(spec.name)) for spec, value in columns]
        lines.append("| " + " | ".join(row) + " |")
    agg = result.get("aggregate") or {}
    if len(runs) > 1:
        row = [f"mean over {len(runs)} runs", "", ""]
        row += [_ci(agg.get(value.key), value.digits, value.scale) for _, value in columns]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Per-run intervals are over the n texts (ΔPPL: interval of the signed "
              "difference of means); the mean-over-runs row has intervals over runs (seeds)."
              " MAUVE's per-run interval (only with --mauve-bootstrap), the classifier AUC's "
              "and the label TVD's are 95% percentile bootstrap intervals over texts, shown "
              "as ± half their width.", ""]
    if result.get("warnings"):
        lines += ["## Warnings", ""] + [f"- {w}" for w in result["warnings"]] + [""]
    lines += ["## Caveats", "",
              "- MAUVE depends on n, the embedder, its truncation and the bucket count: compare "
              "scores only at equal settings (the paper: relative comparisons only).",
              "- Perplexity and lengths depend on the model / tokenizer; compare only under the "
              "same one.", ""]
    plots = [Path(p).name for p in result.get("files", []) if str(p).endswith(".png")]
    if plots:
        lines += ["## Plots", ""] + [f"![{name}]({name})" for name in plots] + [""]
    return "\n".join(lines)


def _cell(value: RunValue, entry: dict[str, Any] | None) -> str:
    """One run's table cell: ``v ± h`` (or ``v (± h)`` for a difference), scaled."""
    v, hw = value.interval(entry)
    if v is None:
        return "–"
    text = f"{v * value.scale:.{value.digits}f}"
    if hw is None:
        return text
    hw_text = f"{hw * value.scale:.{value.digits}f}"
    return f"{text} (± {hw_text})" if value.paren_half_width else f"{text} ± {hw_text}"


def _panels(result: dict[str, Any]) -> dict[str, list[tuple[str, float, float | None]]]:
    """One bar panel per per-run value of every metric: real (if scored), each run, and the
    mean over runs when there are several."""
    runs = result["runs"]
    real = result["real"]
    agg = result.get("aggregate") or {}
    several = len(runs) > 1
    panels: dict[str, list[tuple[str, float, float | None]]] = {}

    def scaled(label: str, mean: float, hw: float | None, scale: float) -> tuple[
            str, float, float | None]:
        return label, mean * scale, None if hw is None else hw * scale

    for name in result["settings"]["metrics"]:
        spec = get_metric(name)
        for value in spec.ordered_values():
            bars: list[tuple[str, float, float | None]] = []
            interval = _get(real, name, *value.real) if value.real is not None else None
            if interval and interval.get("mean") is not None:
                bars.append(scaled("real", interval["mean"], interval.get("half_width"),
                                   value.scale))
            for run in runs:
                v, hw = value.interval(run.get(name))
                if v is not None:
                    bars.append(scaled(run["name"], v, hw, value.scale))
            if several and agg.get(value.key):
                a = agg[value.key]
                bars.append(scaled("mean of runs", a["mean"], a.get("half_width"), value.scale))
            panels[value.panel or value.header] = bars
    return panels


def _atomic_write(path: Path, text: str) -> None:
    """Write atomically with mode 600 from creation: every evaluation file describes the
    held-out real rows (their digest, counts and statistics), which are private by default."""
    from dplang.release import write_atomic

    write_atomic(path, text, private=True)


def write_outputs(result: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write plots, ``report.md`` and ``metrics.json`` into ``out_dir`` (created if needed,
    with mode 700: every file in it is private, and a private file's size and times are
    visible to anyone who may search its folder); returns the paths written
    (``metrics.json`` last)."""
    out = Path(out_dir)
    if not out.exists():
        private_dir(out)
    written: list[Path] = []
    for name in result["settings"]["metrics"]:
        spec = get_metric(name)
        if spec.plots is not None:
            written += spec.plots(result, out)
    panels = _panels(result)
    if panels:
        written.append(plot_metrics(panels, out / "metrics.png"))
    report = out / "report.md"
    metrics_json = out / "metrics.json"
    result["files"] = [str(p) for p in [*written, report, metrics_json]]
    _atomic_write(report, render_markdown(result))
    written.append(report)
    _atomic_write(metrics_json, json.dumps(json_safe(result), indent=2, ensure_ascii=False) + "\n")
    written.append(metrics_json)
    return written
