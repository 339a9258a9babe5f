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

from dplang.evaluation.plots import plot_lengths, plot_metrics

__all__ = ["render_markdown", "write_outputs"]


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN/inf → None, tuples → lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
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
              "n is the smallest number of texts any input provides (or `--num`).", ""]
    lines += ["## Settings", ""]
    if "mauve" in s:
        ms = s["mauve"]
        lines.append(f"- MAUVE: p = real, q = synthetic; embedder {ms['embedder']} (inputs "
                     f"truncated to {ms['max_tokens'] or 'no'} tokens); {ms['num_buckets']} "
                     f"k-means buckets; scaling factor {ms['scaling_factor']}; seed {ms['seed']}")
    if "perplexity" in s:
        ps = s["perplexity"]
        lines.append(f"- perplexity: model {ps['model']}; BOS prepended; at most "
                     f"{ps['max_length']} tokens per text incl. BOS; ΔPPL = "
                     "|mean PPL(synthetic) − mean PPL(real)|")
    if "length" in s:
        lines.append(f"- lengths: tokens of {s['length']['tokenizer']} (no special tokens)")
    if "topk" in metrics:
        lines.append("- Top-k+: effective k = mean of `topk_plus_mean`; expansion tokens = "
                     "mean of `expansion_tokens` (tokens sampled from V_k^+ \\ V_k)")
    lines.append("")

    lines += ["## Results", ""]
    header = ["", "ε", "k"]
    if "mauve" in metrics:
        header.append("MAUVE (%)")
    if "perplexity" in metrics:
        header += ["PPL", "ΔPPL"]
    if "length" in metrics:
        header.append("length (tokens)")
    if "topk" in metrics:
        header += ["effective k", "expansion tokens"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    row = ["real (held-out)", "", ""]
    if "mauve" in metrics:
        row.append("")
    if "perplexity" in metrics:
        row += [_ci(_get(real, "perplexity", "mean")), ""]
    if "length" in metrics:
        row.append(_ci(_get(real, "length", "tokens"), 1))
    if "topk" in metrics:
        row += ["", ""]
    lines.append("| " + " | ".join(row) + " |")
    for run in runs:
        m = run.get("manifest") or {}
        row = [run["name"], _fmt(m.get("epsilon")), _fmt(m.get("top_k"))]
        if "mauve" in metrics:
            row.append(f"{100 * run['mauve']['mauve']:.2f}")
        if "perplexity" in metrics:
            p = run["perplexity"]
            hw = _get(p, "signed_difference", "half_width")
            row += [_ci(p["mean"]),
                    f"{p['delta_ppl']:.2f}" + (f" (± {hw:.2f})" if hw is not None else "")]
        if "length" in metrics:
            row.append(_ci(_get(run, "length", "tokens"), 1))
        if "topk" in metrics:
            row += [_ci(_get(run, "topk", "effective_k")),
                    _ci(_get(run, "topk", "expansion_tokens"))]
        lines.append("| " + " | ".join(row) + " |")
    agg = result.get("aggregate") or {}
    if len(runs) > 1:
        row = [f"mean over {len(runs)} runs", "", ""]
        if "mauve" in metrics:
            row.append(_ci(agg.get("mauve"), 2, 100.0))
        if "perplexity" in metrics:
            row += [_ci(agg.get("ppl_synthetic")), _ci(agg.get("delta_ppl"))]
        if "length" in metrics:
            row.append(_ci(agg.get("length_synthetic"), 1))
        if "topk" in metrics:
            row += [_ci(agg.get("effective_k")), _ci(agg.get("expansion_tokens"))]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Per-run intervals are over the n texts (ΔPPL: interval of the signed "
              "difference of means); the mean-over-runs row has intervals over runs (seeds)."
              " MAUVE has no per-run interval.", ""]
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


def _panels(result: dict[str, Any]) -> dict[str, list[tuple[str, float, float | None]]]:
    runs = result["runs"]
    real = result["real"]
    metrics = result["settings"]["metrics"]
    agg = result.get("aggregate") or {}
    several = len(runs) > 1
    panels: dict[str, list[tuple[str, float, float | None]]] = {}

    def bars(get: Any, real_interval: dict[str, Any] | None = None,
             agg_key: str | None = None, scale: float = 1.0) -> list[Any]:
        out: list[tuple[str, float, float | None]] = []
        if real_interval and real_interval.get("mean") is not None:
            hw = real_interval.get("half_width")
            out.append(("real", real_interval["mean"] * scale,
                        None if hw is None else hw * scale))
        for run in runs:
            value, hw = get(run)
            if value is not None:
                out.append((run["name"], value * scale, None if hw is None else hw * scale))
        if several and agg_key and agg.get(agg_key):
            a = agg[agg_key]
            hw = a.get("half_width")
            out.append(("mean of runs", a["mean"] * scale, None if hw is None else hw * scale))
        return out

    def ci(d: dict[str, Any] | None) -> tuple[Any, Any]:
        return (None, None) if not d else (d.get("mean"), d.get("half_width"))

    if "mauve" in metrics:
        panels["MAUVE (%)"] = bars(lambda r: (r["mauve"]["mauve"], None), None, "mauve", 100.0)
    if "perplexity" in metrics:
        panels["perplexity"] = bars(lambda r: ci(r["perplexity"]["mean"]),
                                    _get(real, "perplexity", "mean"), "ppl_synthetic")
        panels["ΔPPL"] = bars(
            lambda r: (r["perplexity"]["delta_ppl"],
                       _get(r, "perplexity", "signed_difference", "half_width")),
            None, "delta_ppl")
    if "length" in metrics:
        panels["length (tokens)"] = bars(lambda r: ci(r["length"]["tokens"]),
                                         _get(real, "length", "tokens"), "length_synthetic")
    if "topk" in metrics:
        panels["effective k"] = bars(lambda r: ci(r["topk"]["effective_k"]), None,
                                     "effective_k")
        panels["expansion tokens"] = bars(lambda r: ci(r["topk"]["expansion_tokens"]), None,
                                          "expansion_tokens")
    return panels


def _atomic_write(path: Path, text: str) -> None:
    """Write atomically with mode 600 from creation: every evaluation file describes the
    held-out real rows (their digest, counts and statistics), which are private by default."""
    from dplang.release import write_atomic

    write_atomic(path, text, private=True)


def write_outputs(result: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write plots, ``report.md`` and ``metrics.json`` into ``out_dir`` (created if needed);
    returns the paths written (``metrics.json`` last)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    metrics = result["settings"]["metrics"]
    if "length" in metrics:
        written.append(plot_lengths(
            result["real"]["length"]["per_text"],
            {run["name"]: run["length"]["per_text"] for run in result["runs"]},
            out / "lengths.png",
        ))
    panels = _panels(result)
    if panels:
        written.append(plot_metrics(panels, out / "metrics.png"))
    report = out / "report.md"
    metrics_json = out / "metrics.json"
    result["files"] = [str(p) for p in [*written, report, metrics_json]]
    _atomic_write(report, render_markdown(result))
    written.append(report)
    _atomic_write(metrics_json, json.dumps(_clean(result), indent=2, ensure_ascii=False) + "\n")
    written.append(metrics_json)
    return written
