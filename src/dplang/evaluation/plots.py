"""PNG plots of an evaluation (matplotlib, Agg backend: no display needed).

* :func:`plot_lengths` — histograms of real vs synthetic lengths in tokens;
* :func:`plot_metrics` — one panel per metric: real (where it has a value) and every run as
  bars with 99% Wald error bars, plus the mean over runs when there are several.

Privacy contract: both plots show statistics of the held-out real texts (private by default),
so every PNG is written with mode 600 from creation (:func:`save_private_figure`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_lengths", "plot_metrics", "save_private_figure"]


def save_private_figure(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Render ``fig`` as PNG and write it atomically with mode 600 from creation (a plot of
    statistics of private rows is as private as they are; ``chmod`` it to publish)."""
    import io

    from dplang.release import write_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    write_atomic(path, buf.getvalue(), private=True)
    return Path(path)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_lengths(
    real: Sequence[int], synthetic: Mapping[str, Sequence[int]], path: str | Path
) -> Path:
    """Overlaid step histograms of real and synthetic lengths (shared bins); returns ``path``."""
    plt = _pyplot()
    path = Path(path)
    values = [np.asarray(real, dtype=float), *(np.asarray(v, dtype=float)
                                               for v in synthetic.values())]
    upper = max((float(v.max()) for v in values if v.size), default=1.0)
    bins = np.linspace(0.0, max(upper, 1.0), 31)
    fig, ax = plt.subplots(figsize=(7, 4))
    try:
        ax.hist(values[0], bins=bins, histtype="stepfilled", alpha=0.35, color="gray",
                label=f"real (n={values[0].size})")
        for name, v in zip(synthetic, values[1:], strict=True):
            ax.hist(v, bins=bins, histtype="step", linewidth=1.5, label=f"{name} (n={v.size})")
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel("texts")
        ax.set_title("Lengths: real vs synthetic")
        ax.legend(fontsize=8)
        fig.tight_layout()
        save_private_figure(fig, path, dpi=100)
    finally:
        plt.close(fig)
    return path


#: Panels whose values lie in a known range: their error bars stop at its ends (a Wald
#: interval of an AUC near 1 would otherwise reach above 1).
PANEL_RANGES: dict[str, tuple[float, float]] = {
    "classifier AUC": (0.0, 1.0), "label TVD": (0.0, 1.0), "MAUVE (%)": (0.0, 100.0),
    "downstream accuracy (%)": (0.0, 100.0), "downstream macro-F1 (%)": (0.0, 100.0),
    "length (tokens)": (0.0, float("inf")), "perplexity": (0.0, float("inf")),
}


def _error_bars(title: str, heights: Sequence[float], errors: Sequence[float]
                ) -> list[list[float]]:
    """``[[below...], [above...]]`` error bars, cut at the panel's range."""
    low, high = PANEL_RANGES.get(title, (-float("inf"), float("inf")))
    return [[max(0.0, min(e, h - low)) for h, e in zip(heights, errors, strict=True)],
            [max(0.0, min(e, high - h)) for h, e in zip(heights, errors, strict=True)]]


def plot_metrics(panels: Mapping[str, Sequence[tuple[str, float, float | None]]],
                 path: str | Path) -> Path:
    """One bar panel per metric.

    ``panels`` maps a panel title to ``(label, value, half_width or None)`` bars; error bars
    stop at the ends of a panel's range (:data:`PANEL_RANGES`). Returns ``path``."""
    plt = _pyplot()
    path = Path(path)
    count = max(1, len(panels))
    cols = min(3, count)
    rows = -(-count // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(3.8 * cols, 3.4 * rows), squeeze=False)
    axes = list(grid.flat)
    try:
        for ax, (title, bars) in zip(axes, panels.items(), strict=False):
            labels = [b[0] for b in bars]
            heights = [b[1] for b in bars]
            errors = [b[2] if b[2] is not None else 0.0 for b in bars]
            colors = ["gray" if label == "real" else f"C{i % 10}" for i, label in
                      enumerate(labels)]
            ax.bar(range(len(bars)), heights, yerr=_error_bars(title, heights, errors),
                   capsize=4, color=colors, alpha=0.8)
            ax.set_xticks(range(len(bars)))
            ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
            ax.set_title(title, fontsize=9)
        for ax in axes[len(panels):]:
            ax.axis("off")
        fig.suptitle("Metrics (bars: mean; error bars: 99% Wald CI)", fontsize=9)
        fig.tight_layout()
        save_private_figure(fig, path, dpi=100)
    finally:
        plt.close(fig)
    return path
