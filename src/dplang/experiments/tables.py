"""Markdown tables in the paper's layouts and the sweep's plots.

Privacy contract: ``results.md`` and the plots are written with mode 600 from creation: they
hold utility statistics of the held-out real rows (private by default, not differentially
private) and generation timings (a side channel: how long a cell ran depends on the data).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..evaluation.plots import save_private_figure
from ..release import write_atomic

if TYPE_CHECKING:
    from ..privacy.ledger import Spend
    from .config import ExperimentConfig


def _fmt(value: Any, digits: int = 2, scale: float = 1.0) -> str:
    if value is None or value == "":
        return "–"
    return f"{float(value) * scale:.{digits}f}"


def _mean(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None and v != ""]
    return sum(vals) / len(vals) if vals else None


def _legend(ax: Any) -> None:
    """A small legend, when the axes have labelled lines (a plot with no data has none)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def table2(rows: list[dict[str, Any]], metric: str = "mauve", scale: float = 100.0) -> str:
    """Rows ε, columns method × B (and k when several), values averaged over seeds (Table 2
    layout). The public-only cell, if any, is given above the table."""
    cells: dict[tuple[float, tuple[str, int, int]], list[Any]] = defaultdict(list)
    columns: list[tuple[str, int, int]] = []
    public = [r[metric] for r in rows if r["method"] == "public"]
    for r in rows:
        if r["method"] == "public":
            continue
        col = (r["method"], int(r["batch_size"]), int(r["top_k"]))
        if col not in columns:
            columns.append(col)
        cells[(float(r["epsilon"]), col)].append(r[metric])
    columns.sort()
    eps = sorted({e for e, _ in cells})
    lines = []
    if public:
        lines.append(f"Public-only generation (ε = 0, no references): "
                     f"{_fmt(_mean(public), 2, scale)}\n")
    head = ["ε", *(f"{m} B={b} k={k if k else '|V|'}" for m, b, k in columns)]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for e in eps:
        vals = [_fmt(_mean(cells.get((e, c), [])), 2, scale) for c in columns]
        lines.append(f"| {e:g} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def table12(rows: list[dict[str, Any]]) -> str:
    """Rows (ε, B) with C, columns k: effective k and expansion tokens (Table 12 layout)."""
    inv = [r for r in rows if r["method"] == "invisibleink"]
    ks = sorted({int(r["top_k"]) for r in inv if int(r["top_k"]) > 0})
    by: dict[tuple[float, int, int], list[dict[str, Any]]] = defaultdict(list)
    clips: dict[tuple[float, int], list[Any]] = defaultdict(list)
    for r in inv:
        key = (float(r["epsilon"]), int(r["batch_size"]))
        by[(*key, int(r["top_k"]))].append(r)
        clips[key].append(r["clip"])
    head = ["ε", "B", "C"]
    for k in ks:
        head += [f"k={k} Eff. k", f"k={k} #toks"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e, b in sorted(clips):
        vals = [f"{e:g}", str(b), _fmt(_mean(clips[(e, b)]), 3)]
        for k in ks:
            rs = by.get((e, b, k), [])
            vals += [_fmt(_mean([r["effective_k"] for r in rs])),
                     _fmt(_mean([r["expansion_tokens"] for r in rs]))]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def compute_table(rows: list[dict[str, Any]]) -> str:
    """One row per cell: quality (MAUVE, ΔPPL) against compute (model calls per generated
    token, generation wall clock and CPU seconds), sorted by ε, method and B."""
    head = ["ε", "method", "B", "calls/token", "MAUVE (%)", "ΔPPL", "gen s", "CPU s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = sorted(rows, key=lambda r: (float(r["epsilon"]), r["method"],
                                        int(r["batch_size"]), int(r["top_k"])))
    for r in order:
        lines.append("| " + " | ".join([
            f"{float(r['epsilon']):g}" if r["method"] != "public" else "0",
            r["method"], str(r["batch_size"]) if r["method"] != "public" else "–",
            str(r["calls_per_token"]), _fmt(r.get("mauve"), 2, 100.0),
            _fmt(r.get("delta_ppl"), 2),
            _fmt(r.get("gen_seconds"), 0) + ("*" if _true(r.get("resumed")) else ""),
            _fmt(r.get("cpu_seconds"), 0),
        ]) + " |")
    if any(_true(r.get("resumed")) for r in rows):
        lines.append("\n\\* resumed after an interruption: the times cover the continuation only.")
    return "\n".join(lines)


def _true(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def privacy_section(config: ExperimentConfig, sweep_rho: float, sweep_eps: float,
                    releases: int, dataset_total: Spend | None, not_dp: int = 0) -> list[str]:
    """The results' privacy paragraph: the sweep's charge (from the ledger), whether a cell
    is not differentially private (then nothing covers the sweep as a whole), and whether the
    cells' seeds were secret."""
    lines = []
    if not_dp:
        lines += [f"**No differential-privacy guarantee covers this sweep as a whole, or a "
                  f"choice made from its results: {not_dp} of its cells are not differentially "
                  "private** (the non-private ceiling, ε = ∞, or a data-dependent bound such "
                  "as AdaPMixED's; `dplang ledger show` lists them as NOT PRIVATE). The total "
                  "below covers its differentially private cells only.", ""]
    lines += [
        f"Every private cell read the same references, so the sweep's differentially private "
        f"cells compose sequentially: the ledger holds {releases} DP release(s) of this "
        f"sweep, ρ = {sweep_rho:.4g} (ε = {sweep_eps:.4g} at δ = {config.delta:g}), charged to "
        "the dataset's budget in the user's ledger. Choosing the best cell after looking at "
        "these results is covered by this total for the reference rows"
        + (" only when every cell is differentially private" if not_dp else "")
        + ", not by one cell's guarantee; the choice also depends on the held-out rows, which "
        "no guarantee covers.",
    ]
    if dataset_total is not None and dataset_total.dp_releases > releases:
        lines += ["", f"All releases of this dataset in the ledger (this sweep included): "
                  f"{dataset_total.dp_releases} DP release(s), ε = "
                  f"{dataset_total.epsilon_at(config.delta):.4g} at δ = {config.delta:g} "
                  f"under {dataset_total.adjacency} adjacency"
                  + (" (releases of other adjacencies converted by group privacy)"
                     if dataset_total.converted else "") + " (`dplang ledger show`)."]
    if dataset_total is not None and dataset_total.data_dependent:
        lines += ["", f"{dataset_total.data_dependent} release(s) of this dataset have only a "
                  "data-dependent bound (AdaPMixED): they are not differential privacy and are "
                  "not in the totals above."]
    if config.written_seeds:
        lines += ["", "**No privacy guarantee: the cells used seeds written in the "
                  "configuration (`seeds = [...]`).** A seed that is not secret lets anyone "
                  "invert the sampler; written seeds are for toy or public data only. Such "
                  "cells are toy runs everywhere: their public manifests say so (`toy_run`, "
                  "`guarantee.public_seed`), and the ledger records them as toy runs, outside "
                  "every DP total (a dataset with a budget refuses them)."]
    else:
        lines += ["", "Each private cell drew a fresh secret seed from the operating system, "
                  "kept in its private side file `cells/<key>/.dplang-private/gen.private.json` "
                  "(mode 600)."]
    lines += ["", "The utility figures (MAUVE, perplexity) are computed against held-out real "
              "rows of the same data: they are statistics of private data, not differentially "
              "private; publish them only when the held-out rows are public."]
    return lines


def _has(rows: list[dict[str, Any]], key: str) -> bool:
    return any(r.get(key) not in (None, "") for r in rows)


def downstream_section(rows: list[dict[str, Any]]) -> list[str]:
    """The downstream accuracy in the Table 2 layout, with the ceiling (the same classifier
    trained on as many real texts); nothing when the sweep has no ``downstream`` metric."""
    if not _has(rows, "downstream_accuracy"):
        return []
    ceiling = _mean([r.get("downstream_ceiling") for r in rows])
    return ["## Downstream accuracy (%) — train on synthetic, test on real", "",
            table2(rows, "downstream_accuracy"), "",
            f"Ceiling (the same classifier trained on as many held-out real texts): "
            f"{_fmt(ceiling, 1, 100.0)}. The public-only line is the floor. 95% bootstrap "
            "intervals over the test texts are in `results.csv` and each cell's "
            "`eval/downstream.md`.", ""]


def two_sample_section(rows: list[dict[str, Any]]) -> list[str]:
    """The classifier AUC and the label mix (TVD) in the Table 2 layout, with the cells'
    intervals in a compute table; nothing when the sweep has neither metric."""
    out: list[str] = []
    for key, title, scale, digits, note in (
            ("classifier_auc", "Two-sample classifier AUC (0.5 = indistinguishable from the "
             "real texts)", 1.0, 3, "lower is closer to the real texts"),
            ("label_tvd", "Label mix: total variation distance from the real texts' mix",
             1.0, 3, "lower is closer; the public-only cell is the public-prompt baseline")):
        if not _has(rows, key):
            continue
        out += [f"## {title}", "", table2(rows, key, scale), "",
                f"95% bootstrap intervals per cell ({note}):", "",
                "| ε | method | B | calls/token | value [95% interval] |", "|---|---|---|---|---|"]
        for r in sorted(rows, key=lambda r: (float(r["epsilon"]), r["method"],
                                             int(r["batch_size"]))):
            out.append(f"| {float(r['epsilon']):g} | {r['method']} | {r['batch_size']} | "
                       f"{r['calls_per_token']} | {_fmt(r.get(key), digits, scale)} "
                       f"[{_fmt(r.get(key + '_low'), digits, scale)}, "
                       f"{_fmt(r.get(key + '_high'), digits, scale)}] |")
        out.append("")
    return out


def write_results_md(rows: list[dict[str, Any]], path: Path, config: ExperimentConfig,
                     sweep_rho: float, sweep_eps: float, releases: int = 0,
                     dataset_total: Spend | None = None, not_dp: int = 0) -> None:
    parts = [
        f"# Experiment {config.name}",
        "",
        f"Model `{config.model}`, T = {config.max_tokens}, {config.num} generations per cell, "
        f"δ = {config.delta:g}; references rows {list(config.references)}, held-out real rows "
        f"{list(config.real)} of `{config.data_path.name}`.",
        "",
        "## MAUVE (%) — Table 2 layout",
        "",
        table2(rows, "mauve"),
        "",
        "## Top-k+ statistics — Table 12 layout",
        "",
        table12(rows),
        "",
        *downstream_section(rows),
        *two_sample_section(rows),
        "## Quality against compute",
        "",
        compute_table(rows),
        "",
        "## Privacy spent by the sweep",
        "",
        *privacy_section(config, sweep_rho, sweep_eps, releases, dataset_total, not_dp),
        "",
        "Plots: `utility_vs_epsilon.png`, `utility_vs_compute.png`, `effective_k_vs_epsilon.png`"
        + (", `downstream_vs_compute.png`" if _has(rows, "downstream_accuracy") else "")
        + (", `classifier_vs_compute.png`" if _has(rows, "classifier_auc") else "") + ".",
    ]
    write_atomic(path, "\n".join(parts) + "\n", private=True)


def write_plots(rows: list[dict[str, Any]], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    priv = [r for r in rows if r["method"] != "public"]
    public = _mean([r["mauve"] for r in rows if r["method"] == "public"])
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in priv:
        k = int(r["top_k"])
        series[f"{r['method']} B={r['batch_size']} k={k if k else '|V|'}"].append(r)

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        save_private_figure(fig, out_dir / name, dpi=120)  # MAUVE on private rows, timings
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    ceiling = _mean([r["mauve"] for r in priv if not math.isfinite(float(r["epsilon"]))])
    for label, rs in sorted(series.items()):
        eps = sorted({float(r["epsilon"]) for r in rs if math.isfinite(float(r["epsilon"]))})
        ys = [_mean([r["mauve"] for r in rs if float(r["epsilon"]) == e]) for e in eps]
        if any(y is not None for y in ys):
            ax.plot(eps, [100 * y if y is not None else float("nan") for y in ys], "o-",
                    label=label)
    if public is not None:
        ax.axhline(100 * public, color="k", ls="--", label="public only (ε=0)")
    if ceiling is not None:
        ax.axhline(100 * ceiling, color="r", ls=":", label="non-private (ε=∞)")
    ax.set(xlabel="ε (δ = 1e-6)", ylabel="MAUVE (%)", xscale="log", title="Utility vs ε")
    _legend(ax)
    save(fig, "utility_vs_epsilon.png")

    save(_compute_figure(plt, rows, "mauve", "MAUVE (%)"), "utility_vs_compute.png")
    if _has(rows, "downstream_accuracy"):
        save(_compute_figure(plt, rows, "downstream_accuracy", "downstream accuracy (%)",
                             ceiling="downstream_ceiling"), "downstream_vs_compute.png")
    if _has(rows, "classifier_auc"):
        save(_compute_figure(plt, rows, "classifier_auc", "classifier AUC (0.5 = real)",
                             scale=1.0), "classifier_vs_compute.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    ks = sorted({int(r["top_k"]) for r in priv if int(r["top_k"]) > 0})
    for k in ks:
        rs = [r for r in priv if int(r["top_k"]) == k and r["method"] == "invisibleink"]
        eps = sorted({float(r["epsilon"]) for r in rs})
        ys = [_mean([r["effective_k"] for r in rs if float(r["epsilon"]) == e]) for e in eps]
        ax.plot(eps, [(y / k if y is not None else float("nan")) for y in ys], "o-",
                label=f"k={k}")
    ax.set(xlabel="ε", ylabel="effective k / k", xscale="log",
           title="Top-k+ expansion vs ε")
    _legend(ax)
    save(fig, "effective_k_vs_epsilon.png")


def _compute_figure(plt: Any, rows: list[dict[str, Any]], metric: str, ylabel: str,
                    ceiling: str | None = None, scale: float = 100.0) -> Any:
    """``metric`` (× ``scale``) against model calls per token and against generation wall
    clock, one line per (method, ε), with error bars where the cells carry ``metric_low`` /
    ``metric_high`` (95% intervals); the public-only cells (and the ceiling, if any) as
    lines."""
    priv = [r for r in rows if r["method"] != "public"]
    public = _mean([r.get(metric) for r in rows if r["method"] == "public"])
    top = _mean([r.get(ceiling) for r in rows]) if ceiling else None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    by_series: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for r in priv:
        by_series[(r["method"], float(r["epsilon"]))].append(r)
    for (method, e), rs in sorted(by_series.items()):
        rs = sorted(rs, key=lambda r: int(r["calls_per_token"]))
        for ax, xkey in zip(axes, ("calls_per_token", "gen_seconds"), strict=True):
            ok = [r for r in rs if r.get(metric) not in (None, "")
                  and r.get(xkey) not in (None, "")]
            if not ok:
                continue
            xs = [float(r[xkey]) for r in ok]
            ys = [scale * float(r[metric]) for r in ok]
            if all(r.get(f"{metric}_low") not in (None, "") for r in ok):
                err = [[y - scale * float(r[f"{metric}_low"]) for y, r in zip(ys, ok,
                                                                            strict=True)],
                       [scale * float(r[f"{metric}_high"]) - y for y, r in zip(ys, ok,
                                                                             strict=True)]]
                ax.errorbar(xs, ys, yerr=[[max(v, 0.0) for v in side] for side in err],
                            fmt="o-", capsize=3, label=f"{method} ε={e:g}")
            else:
                ax.plot(xs, ys, "o-", label=f"{method} ε={e:g}")
    for ax in axes:
        if public is not None:
            ax.axhline(scale * public, color="k", ls="--", label="public only")
        if top is not None:
            ax.axhline(scale * top, color="g", ls=":", label="real data (ceiling)")
        ax.set(xscale="log")
    calls = sorted({int(r["calls_per_token"]) for r in priv})
    if calls:
        axes[0].set_xticks(calls, [str(c) for c in calls])
        axes[0].minorticks_off()
    axes[0].set(xlabel="model calls per generated token", ylabel=ylabel,
                title="Utility vs compute")
    axes[1].set(xlabel="generation wall clock (s)", title="Utility vs time")
    _legend(axes[0])
    return fig
