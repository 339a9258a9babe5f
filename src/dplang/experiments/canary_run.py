"""The canary run: generate with and without canaries through the release pipeline and count
what comes through (``dplang evaluate canaries``, ``benchmarks/canaries.py``).
It lives in ``experiments`` beside the sweep because it both generates (``textgen``) and
evaluates (:mod:`dplang.evaluation.canaries`: placement, counting, bounds).

The first ``num × B`` rows of the data are copied twice into a temporary folder (mode 700,
files mode 600, removed at the end, also on an error or an interrupt): as they are, and with
canary sentences inserted as first sentence (:mod:`dplang.evaluation.canaries`; one canary per
entry of ``repeats``, each in that many references, no batch holding two canaries). For every
ε both copies are generated with InvisibleInk through the library's release pipeline
(:func:`~dplang.textgen.orchestration.plan_generation`,
:func:`~dplang.textgen.orchestration.execute_plan`: validation, ledger charge, manifest,
private side file) with a **throw-away ledger** in the same folder and the **same seed** for
both runs (one fresh secret seed unless one is given), so that generation j of the two runs
differs only through its own batch. For each canary the table counts the generations that
contain it verbatim or near-verbatim, with and without it, next to the bounds the guarantee
implies (:func:`~dplang.evaluation.canaries.canary_table`), and checks the coupling: a
generation whose batch holds no canary must come out identical in both runs (``coupling.ok``;
a mismatch is a pipeline bug, under which the comparison and the bounds do not hold:
:func:`failed_coupling` names it, and ``dplang evaluate canaries`` exits with an error).

Privacy contract: every generation is a release charged to a ledger (a throw-away one: the
texts never leave the temporary folder, which is deleted); the seed is never written outside
it. The result (:func:`run_canaries`) and every file :func:`write_canary_outputs` writes
(``canaries.json``, ``canaries.md``, ``canaries.png``) describe generations from the private
references and where the canaries were put: they are statistics of private data, not DP
releases, and are written with mode 600 from creation.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dplang.evaluation.canaries import (
    DEFAULT_NEAR_THRESHOLD,
    DEFAULT_NGRAM,
    canary_table,
    insert_canaries,
    make_canaries,
    write_canary_report,
)

__all__ = [
    "DEFAULT_EPSILONS",
    "DEFAULT_REPEATS",
    "CanaryRunError",
    "CanaryRunSettings",
    "check_settings",
    "failed_coupling",
    "plot_canaries",
    "render_canaries",
    "run_canaries",
    "write_canary_outputs",
]

#: The repetitions m of the canaries (one canary per entry).
DEFAULT_REPEATS: tuple[int, ...] = (1, 2, 5, 20, 50)
#: The budgets generated at.
DEFAULT_EPSILONS: tuple[float, ...] = (1.0, 10.0)


class CanaryRunError(ValueError):
    """A canary run that cannot be done as asked (one-line message)."""


@dataclass(frozen=True)
class CanaryRunSettings:
    """What a canary run generates (all public; the data are the private part).

    ``seed``: ``None`` draws one fresh secret seed for every run (with and without the
    canaries, every ε), kept in memory only; a given seed is not secret (toy or public data
    only). ``canary_seed`` chooses the canary texts and rows (a function of the row count, B
    and the repeats, never of the data)."""

    data: Path
    epsilons: tuple[float, ...] = DEFAULT_EPSILONS
    repeats: tuple[int, ...] = DEFAULT_REPEATS
    num: int = 32
    batch_size: int = 3
    max_tokens: int = 32
    top_k: int = 50
    temperature: float = 1.2
    delta: float = 1e-6
    model: str = "default"
    text_column: str = "text"
    prompt: str = "generic"
    seed: int | None = field(default=None, repr=False)
    canary_seed: int = 0
    concurrent_groups: int = 8

    @property
    def rows(self) -> int:
        """References used: ``num × B``."""
        return self.num * self.batch_size


def check_settings(settings: CanaryRunSettings) -> None:
    """Refuse, before anything is read or loaded, settings that cannot give the run asked
    for: sizes, budgets, and canaries that do not fit in ``num`` batches of B references
    (each canary in whole batches of its own, so Σ⌈m/B⌉ ≤ num)."""
    from dplang.privacy.accounting import BudgetLimitError, check_budget_limit

    s = settings
    for name, value, low in (("--num", s.num, 1), ("--batch-size", s.batch_size, 1),
                             ("--max-tokens", s.max_tokens, 1), ("--top-k", s.top_k, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CanaryRunError(f"{name} must be an integer >= {low}, got {value!r}")
    if not s.epsilons:
        raise CanaryRunError("give at least one ε")
    for eps in s.epsilons:
        try:
            check_budget_limit(eps, name="--epsilon")
        except BudgetLimitError as exc:
            raise CanaryRunError(str(exc)) from None
    if not 0 < s.delta < 1:
        raise CanaryRunError(f"--delta must be in (0, 1), got {s.delta}")
    if not (math.isfinite(s.temperature) and s.temperature > 0):
        raise CanaryRunError(f"--temperature must be finite and > 0, got {s.temperature}")
    if not s.repeats or any(isinstance(m, bool) or not isinstance(m, int) or m < 1
                            for m in s.repeats):
        raise CanaryRunError(f"--repeats must be integers >= 1, got {list(s.repeats)}")
    batches = sum(math.ceil(m / s.batch_size) for m in s.repeats)
    if batches > s.num:
        raise CanaryRunError(
            f"canaries in m = {', '.join(map(str, s.repeats))} references need {batches} whole "
            f"batches of B = {s.batch_size} (no batch holds two canaries) but --num {s.num} "
            f"generations read {s.num}; raise --num to at least {batches} (num × B references)")
    if not Path(s.data).is_file():
        raise CanaryRunError(f"data file not found: {s.data}")


def _write_private_jsonl(path: Path, texts: Sequence[str]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for text in texts:
            fh.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


def _read_outputs(path: Path) -> tuple[list[str], list[list[int]]]:
    """Texts and reference rows of a generation output, in group order."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
               if line.strip()]
    records.sort(key=lambda r: r["group"])
    return ([r["text"] for r in records],
            [[int(i) for i in r.get("reference_ids") or ()] for r in records])


def run_canaries(
    settings: CanaryRunSettings,
    load_model: Callable[[str], Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Generate with and without the canaries for every ε; return the result (private: write
    it with :func:`write_canary_outputs`).

    ``load_model(spec)`` loads the model (default :func:`dplang.models.resolve_model`, once
    for the whole run). Raises :class:`CanaryRunError` for settings or data that cannot give
    the run (before any model load), and the pipeline's errors
    (:class:`~dplang.textgen.orchestration.GenerationError`, ...) as they are."""
    from dplang.io import load_references
    from dplang.release import fresh_seed
    from dplang.textgen.orchestration import GenerationRequest, execute_plan, plan_generation

    check_settings(settings)
    say = progress or (lambda _message: None)
    s = settings
    records, _stats = load_references(s.data, s.text_column, limit=s.rows)
    if len(records) < s.rows:
        raise CanaryRunError(f"{Path(s.data).name}: --num {s.num} × B = {s.batch_size} need "
                             f"{s.rows} rows, the file has fewer")
    texts = [r.text or "" for r in records]
    canaries = make_canaries(s.repeats, s.rows, seed=s.canary_seed, batch_size=s.batch_size)
    cache: dict[str, Any] = {}

    def load(spec: str) -> Any:
        if spec not in cache:
            if load_model is not None:
                cache[spec] = load_model(spec)
            else:
                from dplang.models import resolve_model

                cache[spec] = resolve_model(spec)
        return cache[spec]

    seed = s.seed if s.seed is not None else fresh_seed()
    public = {k: v for k, v in asdict(s).items() if k not in ("seed", "data")}
    result: dict[str, Any] = {
        "settings": {**public, "epsilons": list(s.epsilons), "repeats": list(s.repeats),
                     "data": str(s.data), "data_rows": s.rows, "method": "invisibleink",
                     "seed": "given" if s.seed is not None else "secret (fresh, not kept)",
                     "ngram": DEFAULT_NGRAM, "near_threshold": DEFAULT_NEAR_THRESHOLD,
                     "confidence": 0.95, "adjacency": "replace-by-null"},
        "canaries": [{"text": c.text, "repeats": c.repeats, "rows": list(c.rows)}
                     for c in canaries],
        "cells": [],
    }
    with tempfile.TemporaryDirectory(prefix="dplang-canaries-") as tmp_name:
        tmp = Path(tmp_name)
        os.chmod(tmp, 0o700)
        data = {"without": tmp / "without.jsonl", "with": tmp / "with.jsonl"}
        _write_private_jsonl(data["without"], texts)
        _write_private_jsonl(data["with"], insert_canaries(texts, canaries))
        for eps in s.epsilons:
            outputs: dict[str, list[str]] = {}
            batches: dict[str, list[list[int]]] = {}
            seconds: dict[str, float] = {}
            rho = None
            for side, path in data.items():
                request = GenerationRequest(
                    data=path, out=tmp / f"{side}-eps{eps:g}.jsonl",
                    batch_size=s.batch_size, max_tokens=s.max_tokens,
                    temperature=s.temperature, top_k=s.top_k, epsilon=eps, delta=s.delta,
                    num=s.num, seed=seed, model=s.model, prompt=s.prompt,
                    # the audit couples the runs with and without the canaries (the same
                    # noise for both): toy runs in a throw-away ledger, never releases
                    coupling="canaries", public_seed=True,
                    concurrent_groups=s.concurrent_groups,
                    ledger=tmp / "ledger.sqlite", dataset=f"canaries-{side}",
                )
                start = time.perf_counter()
                plan = plan_generation(request, load)
                execute_plan(plan)
                seconds[side] = time.perf_counter() - start
                rho = plan.guarantee.rho
                outputs[side], batches[side] = _read_outputs(request.out)
                say(f"ε={eps:g} {side} canaries: {len(outputs[side])} texts in "
                    f"{seconds[side]:.0f} s")
            if rho is None or batches["with"] != batches["without"]:
                raise RuntimeError("the runs with and without the canaries were not coupled")
            rows = canary_table(canaries, outputs["with"], outputs["without"], rho,
                                batches=batches["with"])
            canary_rows = {r for c in canaries for r in c.rows}
            clean = [j for j, b in enumerate(batches["with"]) if not canary_rows.intersection(b)]
            same = sum(outputs["with"][j] == outputs["without"][j] for j in clean)
            result["cells"].append({
                "epsilon": eps, "rho": rho, "seconds": seconds,
                "generations": len(outputs["with"]), "rows": rows,
                "coupling": {"batches_without_canary": len(clean), "identical": same,
                             "ok": same == len(clean)},
            })
    return result


def failed_coupling(result: dict[str, Any]) -> str | None:
    """A one-line description of the cells whose coupling check failed, or ``None``."""
    bad = [c for c in result["cells"]
           if c["coupling"]["identical"] != c["coupling"]["batches_without_canary"]]
    if not bad:
        return None
    parts = []
    for c in bad:
        clean, same = c["coupling"]["batches_without_canary"], c["coupling"]["identical"]
        parts.append(f"at ε = {c['epsilon']:g}, {clean - same} of {clean} generations that "
                     "read no canary differ between the runs")
    return ("the coupling check failed: " + "; ".join(parts)
            + " (a bug of the pipeline: the comparison and the bounds do not hold there)")


def render_canaries(result: dict[str, Any]) -> str:
    """The result as a markdown table (``canaries.md``)."""
    s = result["settings"]
    lines = [
        "# Canaries: what comes through",
        "",
        f"InvisibleInk, model `{s['model']}`, B = {s['batch_size']}, T = {s['max_tokens']}, "
        f"k = {s['top_k']}, τ = {s['temperature']:g}, δ = {s['delta']:g}, prompt "
        f"`{s['prompt']}`; {s['num']} generations per run from the first {s['data_rows']} "
        f"rows, with and without the canaries (same seed: {s['seed']}). Near-verbatim: at "
        f"least {100 * s['near_threshold']:.0f}% of the canary's word {s['ngram']}-grams. "
        "Rates are of near-verbatim occurrences with 95% Clopper–Pearson intervals; bounds "
        "are on the expected rate, per generation (parallel composition) and for the whole "
        "release (group of k = 2m), from a 95% upper bound on the rate without the canary.",
        "",
        "| ε | m | k = 2m | generations reading it | verbatim with / without | "
        "near with / without | max 3-gram overlap with / without | near rate with [95% CI] "
        "| bound per generation | bound, group k = 2m |",
        "|---:|---:|---:|---:|---|---|---|---|---:|---:|",
    ]
    for cell in result["cells"]:
        n = cell["generations"]
        for r in cell["rows"]:
            w, base = r["with"], r["baseline"]
            lo, hi = r["rate_with_interval"]
            lines.append(
                f"| {cell['epsilon']:g} | {r['repeats']} | {r['group_size']} | "
                f"{r.get('affected_generations', '–')} | {w['verbatim']}/{n} / "
                f"{base['verbatim']}/{n} | {w['near']}/{n} / {base['near']}/{n} | "
                f"{w['max_overlap']:.2f} / {base['max_overlap']:.2f} | "
                f"{r['rate_with']:.3f} [{lo:.3f}, {hi:.3f}] | "
                f"{r.get('bound_parallel', float('nan')):.3g} | {r['bound_rate_with']:.3g} |")
    lines += ["", "Coupling (same seed): generations whose batch holds no canary, identical "
              "in both runs:"]
    for cell in result["cells"]:
        c = cell["coupling"]
        line = (f"- ε = {cell['epsilon']:g} (ρ = {cell['rho']:.4g}): "
                f"{c['identical']} of {c['batches_without_canary']}")
        if c["identical"] != c["batches_without_canary"]:
            line += (" — MISMATCH: generations that read no canary differ between the runs, "
                     "a bug of the pipeline; the comparison and the bounds at this ε do not "
                     "hold")
        lines.append(line)
    lines += ["", "Private: this file describes generations from the references (mode 600).",
              ""]
    return "\n".join(lines)


def plot_canaries(result: dict[str, Any], path: str | Path) -> Path:
    """Near-verbatim rate against repetition m (log scale) for every ε, with its 95% interval,
    and the bounds (solid: per generation; dotted: group k = 2m). Mode 600."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from dplang.evaluation.plots import save_private_figure

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    cells = result["cells"]
    offsets = [0.94 + 0.12 * i / max(1, len(cells) - 1) for i in range(len(cells))]
    for i, cell in enumerate(cells):
        rows = sorted(cell["rows"], key=lambda r: r["repeats"])
        ms = [r["repeats"] for r in rows]
        colour = f"C{i}"
        rates = [r["rate_with"] for r in rows]
        lows = [r["rate_with"] - r["rate_with_interval"][0] for r in rows]
        highs = [r["rate_with_interval"][1] - r["rate_with"] for r in rows]
        ax.errorbar([m * offsets[i] for m in ms], rates, yerr=[lows, highs], fmt="o",
                    color=colour, capsize=3, label=f"observed, ε = {cell['epsilon']:g}")
        if all("bound_parallel" in r for r in rows):
            ax.plot(ms, [r["bound_parallel"] for r in rows], "-", color=colour,
                    label=f"bound per generation, ε = {cell['epsilon']:g}")
        ax.plot(ms, [r["bound_rate_with"] for r in rows], ":", color=colour,
                label=f"bound, group k = 2m, ε = {cell['epsilon']:g}")
    s = result["settings"]
    ax.set(xscale="log", xlabel="m: references holding the canary",
           ylabel="generations with the canary (near-verbatim)", ylim=(-0.03, 1.03),
           title=f"Canaries: InvisibleInk, B = {s['batch_size']}, T = {s['max_tokens']}, "
                 f"{s['num']} generations per run")
    ms_all = sorted({r["repeats"] for cell in cells for r in cell["rows"]})
    ax.set_xticks(ms_all, [str(m) for m in ms_all])
    ax.minorticks_off()
    ax.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    out = save_private_figure(fig, path, dpi=120)
    plt.close(fig)
    return out


def write_canary_outputs(result: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """``canaries.json``, ``canaries.md`` and ``canaries.png`` in ``out_dir``, **mode 600
    from creation** (they describe generations from the private references)."""
    from dplang.release import private_dir, write_atomic

    out = Path(out_dir)
    if not out.exists():  # a new folder only its owner can enter (as `evaluate --out`): the
        private_dir(out)  # sizes and times of the files, and the run lock's, are private
    md = out / "canaries.md"
    write_atomic(md, render_canaries(result), private=True)
    png = plot_canaries(result, out / "canaries.png")
    js = write_canary_report(result, out / "canaries.json")
    return [md, png, js]
