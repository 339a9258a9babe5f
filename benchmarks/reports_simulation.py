"""Simulations of proposal-and-filter on synthetic supports (spec 003 §5.3, E1, E2, E3, E7).

Checks, with confidence intervals, that

* UnsupportedEmit = |O ∩ U| / |U| stays ≤ β (Theorem 5.1);
* the mean EmitRate lies inside Theorem 5.2's interval [(1−β)p_{θ+2τ}, p_θ + β(1−p_θ)] and
  matches the exact expectation mean_j g(f_j);
* the empirical emission curve matches the exact g(f) of spec §2.3, for each noise family;
* Bonferroni keeps the family-wise unsupported-emission probability ≤ β (E7).

Synthetic supports: for each configuration a fixed list of m candidates whose supports are
drawn once from the spec's mixture 50% U[0, 0.06] + 50% U[0, 0.3] and rounded to counts
(a fixed list: Theorem 5.2 holds with p_a = fraction of the list, spec §3 note iii). Each run
redraws only the noise. Noise is drawn with the same samplers the reports use (the exact
discrete Laplace sampler included); decisions use ``SupportTest.emits_array``.

Run (writes docs/img/reports_*.png and prints Markdown tables)::

    .venv/bin/python benchmarks/reports_simulation.py --runs 1000 --seed 2024

``--quick`` runs a small grid for a smoke test.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dplang.privacy.audit import clopper_pearson
from dplang.privacy.randomness import RandomStreams
from dplang.reports.evaluation import (
    emit_rate,
    exact_expected_emit_rate,
    false_emission,
    theorem_5_2_interval,
    unsupported_emit,
)
from dplang.reports.mechanism import FilterConfig, calibrate

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Row:
    family: str
    n: int
    m: int
    eps: float
    beta: float
    theta: float
    tau: float
    lo: float
    hi: float
    exact: float
    emit: float
    emit_ci: float
    unsupported: float
    unsupported_hi: float
    false_emission: float
    exact_se: float
    seconds: float

    @property
    def z(self) -> float:
        """(simulated − exact) / standard error of the simulated mean (exact law)."""
        return (self.emit - self.exact) / self.exact_se if self.exact_se > 0 else 0.0

    @property
    def inside(self) -> bool:
        return self.lo - self.emit_ci <= self.emit <= self.hi + self.emit_ci


MASTER = 1000  # candidates in the master list; a configuration with m uses the first m
FIXED_LIST = 100  # the candidates evaluated in the EmitRate-vs-m sweep, whatever m


def supports_for(n: int, m: int, streams: RandomStreams) -> np.ndarray:
    """Counts of the first m candidates of a fixed master list (one per n) whose supports are
    drawn from 50% U[0,0.06] + 50% U[0,0.3]: configurations differing only in m, ε or β share
    candidates."""
    rng = streams.generator(0, n)
    wide = rng.random(MASTER) < 0.5
    f = np.where(wide, rng.uniform(0, 0.3, MASTER), rng.uniform(0, 0.06, MASTER))
    return np.rint(f[:m] * n).astype(np.int64)


def simulate(family: str, n: int, m: int, eps: float, beta: float, theta: float, runs: int,
             streams: RandomStreams, index: int, bonferroni: bool = False,
             list_size: int | None = None) -> tuple[Row, np.ndarray, np.ndarray]:
    """One configuration. The budget is split over m tests (ε₀ = ε/m); the candidates
    evaluated are the first m of the master list, or, with ``list_size``, always the first
    ``list_size`` (a fixed list, so that a sweep over m changes only ε₀ and τ)."""
    t0 = time.time()
    cfg = FilterConfig(epsilon=eps, beta=beta, theta=theta, noise=family, delta=1e-5,
                       bonferroni=bonferroni)
    test, _ = calibrate(cfg, m, n)
    counts = supports_for(n, list_size or m, streams)
    noise = test.sample_array(streams.generator(index, 1), (runs, counts.size))
    emitted = test.emits_array(counts[None, :], noise, theta)
    f = counts / n
    iv = theorem_5_2_interval(f, theta, test.tau, test.beta)
    per_run = emitted.mean(axis=1)
    probs = [test.emit_probability(int(c), theta) for c in counts]
    u = f < theta
    o_u = int((emitted & u[None, :]).sum())
    n_u = int(u.sum()) * runs
    _, u_hi = clopper_pearson(o_u, n_u, 0.95) if n_u else (math.nan, math.nan)
    row = Row(family, n, m, eps, beta, theta, test.tau, iv.lower, iv.upper,
              exact_expected_emit_rate(counts, test, theta), emit_rate(emitted),
              1.96 * per_run.std(ddof=1) / math.sqrt(runs),
              unsupported_emit(emitted, f, theta), u_hi, false_emission(emitted, f, theta),
              math.sqrt(sum(g * (1 - g) for g in probs)) / counts.size / math.sqrt(runs),
              time.time() - t0)
    return row, emitted, counts


def table(rows: list[Row]) -> str:
    head = ("| noise | n | m | ε | β | θ | τ | interval [lo, hi] | exact E[EmitRate] | "
            "EmitRate ± 95% | inside | UnsupportedEmit (95% upper) | ≤ β | FalseEmission |")
    out = [head, "|" + "---|" * 14]
    for r in rows:
        out.append(
            f"| {r.family} | {r.n} | {r.m} | {r.eps:g} | {r.beta:g} | {r.theta:g} | "
            f"{r.tau:.4f} | "
            f"[{r.lo:.3f}, {r.hi:.3f}] | {r.exact:.4f} | {r.emit:.4f} ± {r.emit_ci:.4f} | "
            f"{'yes' if r.inside else 'NO'} | {r.unsupported:.4f} ({r.unsupported_hi:.4f}) | "
            f"{'yes' if r.unsupported <= r.beta else 'NO'} | {r.false_emission:.4f} |")
    return "\n".join(out)


def emission_curves(out_dir: Path, streams: RandomStreams, draws: int) -> str:
    """E1: exact g(f) against its empirical estimate, per family (n=1000, m=100, ε=10)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n, m, eps, beta, theta = 1000, 100, 10.0, 0.05, 0.05
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True)
    lines = ["| noise | τ | Pr[emit] at f=θ exact / empirical | at f=θ+2τ exact / empirical | "
             "max abs. deviation (all points) |", "|---|---|---|---|---|"]
    for k, (family, ax) in enumerate(zip(("discrete-laplace", "laplace", "gaussian"), axes,
                                         strict=True)):
        cfg = FilterConfig(epsilon=eps, beta=beta, theta=theta, noise=family, delta=1e-5)
        test, _ = calibrate(cfg, m, n)
        tc = test.tau_count
        lo_c, hi_c = max(0, math.floor(theta * n - 3 * tc)), math.ceil(theta * n + 5 * tc)
        grid = np.arange(lo_c, hi_c + 1, max(1, (hi_c - lo_c) // 40))
        # f = θ and f = θ + 2τ exactly (integers for the discrete family; the continuous
        # families' law is defined for real counts too)
        special = np.array([theta * n, theta * n + 2 * tc])
        if test.is_discrete:
            special = np.rint(special)
        grid = np.unique(np.concatenate([grid.astype(float), special]))
        fine = np.linspace(lo_c, hi_c, 400)
        exact_fine = [test.emit_probability(c, theta) for c in fine] if not test.is_discrete \
            else [test.emit_probability(math.floor(c), theta) for c in fine]
        emp, err = [], []
        for i, c in enumerate(grid):
            z = test.sample_array(streams.generator(100 + k, i), draws)
            hits = int(test.emits_array(np.full(draws, c), z, theta).sum())
            lo, hi = clopper_pearson(hits, draws, 0.95)
            emp.append(hits / draws)
            err.append((hits / draws - lo, hi - hits / draws))
        exact = np.array([test.emit_probability(c, theta) for c in grid])
        emp = np.array(emp)
        ax.plot(fine / n, exact_fine, "-", color="C0", label="exact g(f)")
        ax.errorbar(grid / n, emp, yerr=np.array(err).T, fmt="o", ms=3, color="C3",
                    label=f"empirical ({draws} draws, 95% CI)")
        ax.axhline(beta, ls=":", color="gray")
        ax.axhline(1 - beta, ls=":", color="gray")
        ax.axvline(theta, ls="--", color="C2", label="θ")
        ax.axvline(theta + 2 * test.tau, ls="--", color="C1", label="θ + 2τ")
        ax.set_title(f"{family}: τ = {test.tau:.4f}")
        ax.set_xlabel("true support f")
        if k == 0:
            ax.set_ylabel("Pr[emit]")
        ax.legend(fontsize=7, loc="upper left")
        i_t = int(np.argmin(np.abs(grid - special[0])))
        i_2 = int(np.argmin(np.abs(grid - special[1])))
        lines.append(f"| {family} | {test.tau:.4f} | {exact[i_t]:.4f} / {emp[i_t]:.4f} | "
                     f"{exact[i_2]:.4f} / {emp[i_2]:.4f} | {np.abs(exact - emp).max():.4f} |")
    fig.suptitle(f"Emission probability g(f) (n={n}, m={m}, ε={eps:g}, β={beta}, θ={theta})")
    fig.tight_layout()
    fig.savefig(out_dir / "reports_emission_curve.png", dpi=110)
    plt.close(fig)
    return "\n".join(lines)


def sweep_plots(out_dir: Path, rows_eps: list[Row], rows_m: list[Row], rows_all: list[Row]
                ) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for rows, key, name, xlabel in ((rows_eps, "eps", "reports_emitrate_vs_eps.png", "ε total"),
                                    (rows_m, "m", "reports_emitrate_vs_m.png",
                                     "m (tests the budget ε is split over)")):
        fig, ax = plt.subplots(figsize=(6, 4))
        x = np.array([getattr(r, key) for r in rows], dtype=float)
        ax.fill_between(x, [r.lo for r in rows], [r.hi for r in rows], alpha=0.25,
                        label="Theorem 5.2 interval")
        ax.plot(x, [r.exact for r in rows], "-", label="exact E[EmitRate]")
        ax.errorbar(x, [r.emit for r in rows], yerr=[r.emit_ci for r in rows], fmt="o",
                    label="simulated (95% CI)")
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("EmitRate")
        r0 = rows[0]
        fixed = (f"n={r0.n}, m={r0.m}" if key == "eps" else
                 f"n={r0.n}, ε={r0.eps:g}, the same {FIXED_LIST} candidates at ε₀ = ε/m")
        ax.set_title(f"{r0.family}, {fixed}, β={r0.beta}, θ={r0.theta}", fontsize=8)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for beta in sorted({r.beta for r in rows_all}):
        sel = [r for r in rows_all if r.beta == beta]
        y = [r.unsupported for r in sel]
        yerr = [[0] * len(sel), [max(0.0, r.unsupported_hi - r.unsupported) for r in sel]]
        ax.errorbar(range(len(sel)), y, yerr=yerr, fmt="o", ms=3, label=f"β = {beta}")
        ax.axhline(beta, ls=":", color="gray")
    ax.set_xlabel("configuration (n, m, ε, noise)")
    ax.set_ylabel("UnsupportedEmit (95% upper bar)")
    ax.set_title("Theorem 5.1: UnsupportedEmit ≤ β in every configuration")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "reports_unsupported_emit.png", dpi=110)
    plt.close(fig)


def familywise(streams: RandomStreams, runs: int) -> str:
    """E7: Pr[any unsupported candidate emitted] with and without Bonferroni, vs m."""
    n, eps_per, beta, theta = 1000, 0.5, 0.05, 0.1
    lines = ["| m | per-candidate β: Pr[any unsupported emitted] | bound mβ | Bonferroni "
             "(β/m): Pr[any] | bound β |", "|---|---|---|---|---|"]
    for i, m in enumerate((1, 5, 20, 50)):
        counts = np.full(m, round(theta * n) - 1)  # every candidate just below θ
        out = []
        for bonf in (False, True):
            cfg = FilterConfig(epsilon=eps_per * m, beta=beta, theta=theta, bonferroni=bonf)
            test, _ = calibrate(cfg, m, n)
            z = test.sample_array(streams.generator(200 + i, int(bonf)), (runs, m))
            any_emit = test.emits_array(counts[None, :], z, theta).any(axis=1)
            out.append(any_emit.mean())
        lines.append(f"| {m} | {out[0]:.4f} | {min(1, m * beta):.2f} | {out[1]:.4f} | "
                     f"{beta} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--draws", type=int, default=20000, help="draws per curve point")
    parser.add_argument("--out-dir", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--quick", action="store_true", help="small grid (smoke test)")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    streams = RandomStreams(args.seed)
    t0 = time.time()

    ns = (500, 1268, 5000) if not args.quick else (1268,)
    ms = (10, 50, 100, 500) if not args.quick else (10, 100)
    epss = (1.0, 3.0, 10.0) if not args.quick else (10.0,)
    rows: list[Row] = []
    index = 0
    for n in ns:
        for m in ms:
            for eps in epss:
                index += 1
                rows.append(simulate("discrete-laplace", n, m, eps, 0.05, 0.05, args.runs,
                                     streams, index)[0])
    for family in ("laplace", "gaussian"):
        for m in ms:
            index += 1
            rows.append(simulate(family, 1268, m, 10.0, 0.05, 0.05, args.runs, streams,
                                 index)[0])
    for beta in (0.01, 0.1):
        for theta in (0.02, 0.1):
            index += 1
            rows.append(simulate("discrete-laplace", 1268, 100, 10.0, beta, theta, args.runs,
                                 streams, index)[0])
    print(f"## Theorem 5.1 / 5.2 grid ({args.runs} runs per row, seed {args.seed})\n")
    print(table(rows))
    inside = sum(r.inside for r in rows)
    below = sum(r.unsupported <= r.beta for r in rows)
    print(f"\nEmitRate inside the Theorem 5.2 interval (±95% CI): {inside}/{len(rows)}; "
          f"UnsupportedEmit ≤ β: {below}/{len(rows)}; "
          f"largest |simulated − exact| = {max(abs(r.emit - r.exact) for r in rows):.4f}; "
          f"rows beyond 3 standard errors (normal approximation; unreliable when very few "
          f"emissions are expected): {sum(abs(r.z) > 3 for r in rows)}\n")

    rows_eps = [simulate("discrete-laplace", 1268, 100, e, 0.05, 0.05, args.runs, streams,
                         300 + i)[0] for i, e in enumerate((0.3, 1, 3, 10, 30, 100))]
    # the candidates are held fixed (the first FIXED_LIST of the master list) while m, the
    # number of tests the budget is split over, varies: the plot isolates m (ε₀ = ε/m, τ)
    rows_m = [simulate("discrete-laplace", 1268, m, 10.0, 0.05, 0.05, args.runs, streams,
                       400 + i, list_size=FIXED_LIST)[0]
              for i, m in enumerate((5, 10, 20, 50, 100, 200, 500, 1000))]
    sweep_plots(args.out_dir, rows_eps, rows_m, rows)
    print(f"## EmitRate vs ε (n=1268, m=100) and vs m (n=1268, ε=10; the same {FIXED_LIST} "
          "candidates evaluated at every m, ε₀ = ε/m)\n")
    print(table(rows_eps + rows_m))
    print("\n## Emission curve g(f): exact vs empirical\n")
    print(emission_curves(args.out_dir, streams, args.draws))
    print("\n## Family-wise unsupported emission (all candidates at f = θ − 1/n, "
          f"ε₀ = 0.5, {args.runs * 4} runs)\n")
    print(familywise(streams, args.runs * 4))
    print(f"\nwrote {', '.join(p.name for p in sorted(args.out_dir.glob('reports_*.png')))} "
          f"to {args.out_dir}; total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
