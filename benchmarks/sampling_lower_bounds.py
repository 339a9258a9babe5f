"""Paper 004: lower bounds measured, claim 16, the zero-bias principle, and A3's TV measured.

    .venv/bin/python benchmarks/sampling_lower_bounds.py [--img docs/img] [--reps 6]

Everything is synthetic; ε = 1, δ = 1e-6, α = 0.1 unless stated. Sections:

A. Theorem 1.7 (Ω(d) for general products) on its instance ``subset_product(d/2)``: the n at
   which the Gaussian-marginal, per-coordinate Laplace and general (A3) samplers put at most α
   mass outside P's support (claim 18), and at which their TV is ≤ α, against the Ω(d) shape.
B. Theorem 1.9 (Ω(√d/ε) for bounded biases): the n at which the clipped-mean sampler is
   (ε, δ)-DP and α-accurate and at which the Gaussian-marginal sampler is α-accurate (exact, all
   biases 1/3, the worst case of every coordinate), against √d/ε, for ε = 0.25 and 1.
C. Claim 16: the noisy-histogram learner's α (Definition 1.2, Monte Carlo) against the exact TV
   of the sampler built from it (A1, k = 10, Poisson sizes).
D. F9, the zero-bias principle: A1's exact TV split into elements absent from / present in P's
   support, against the learner's mean error E d_TV(P̃, P).
E. A3's TV on Theorem 1.7's instance *measured* (importance sampling under P of
   the mixture of simulated plans, with 95% intervals) at d = 256, 1024, 4096, next to the
   earlier rigorous upper bound and an exact lower bound (mass outside the support), and the
   Gaussian-marginal sampler's TV measured the same way.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from dplang.sampling import (
    BucketedProductSampler,
    ClippedMeanSampler,
    GaussianMarginalSampler,
    LaplaceHistogramSampler,
    PerCoordinateLaplaceSampler,
    bounds,
)
from dplang.sampling import distributions as dist
from dplang.sampling.evaluation import (
    exact_output_law_poisson,
    minimal_n,
    product_tv,
)
from dplang.sampling.lower_bounds import (
    bias_decomposition,
    bucketed_marginals,
    claim16_check,
    mixture_support_miss,
    mixture_tv_monte_carlo,
    support_miss_product,
)

EPS, DELTA, ALPHA = 1.0, 1e-6, 0.1


def slope(x, y) -> float:
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


# ------------------------------------------------------------------------------------- A

def _a3_eval(d: int, n: float, reps: int, seed: int, samples: int) -> dict[str, float]:
    s = BucketedProductSampler(EPS, DELTA, ALPHA)
    p = dist.subset_product(d // 2)
    pm = bucketed_marginals(s, p, int(n), reps, np.random.default_rng(seed))
    tv = mixture_tv_monte_carlo(pm.q, p, samples, np.random.default_rng(seed + 1))
    trunc = float(pm.truncation.mean())
    return {"miss": mixture_support_miss(pm, p), "tv": tv.estimate + trunc,
            "tv_hi": min(1.0, tv.upper + trunc), "tv_lo": max(0.0, tv.lower - trunc)}


def section_a(img: Path, reps: int) -> None:
    print("\n## A. Theorem 1.7's instance: n for mass outside the support ≤ α and for TV ≤ α\n")
    ds = [4, 8, 16, 32, 64, 128, 256]
    gau, lap = GaussianMarginalSampler(EPS, DELTA), PerCoordinateLaplaceSampler(EPS)
    rows = []
    for d in ds:
        p = dist.subset_product(d // 2)
        r = {"d": d}
        for name, s in (("gauss", gau), ("lap", lap)):
            r[f"{name}_miss"] = minimal_n(
                lambda n, s=s, p=p: support_miss_product(s.exact_marginals(int(n), p), p),
                ALPHA, 2.0, 1e9, rel_tol=0.01, integer=True)
            r[f"{name}_tv"] = minimal_n(
                lambda n, s=s, p=p: product_tv(s.exact_marginals(int(n), p), p).value,
                ALPHA, 2.0, 1e9, rel_tol=0.01, integer=True)
        r["a3_miss"] = minimal_n(lambda n, d=d: _a3_eval(d, n, reps, d, 4000)["miss"], ALPHA,
                                 50.0, 1e9, rel_tol=0.03, integer=True)
        r["a3_tv"] = minimal_n(lambda n, d=d: _a3_eval(d, n, reps, d, 4000)["tv_hi"], ALPHA,
                               50.0, 1e9, rel_tol=0.03, integer=True)
        rows.append(r)
        print(f"  d = {d} done", flush=True)
    print("\n| d | Gaussian marginals: miss ≤ α | TV ≤ α | per-coord. Laplace: miss ≤ α | "
          "TV ≤ α | A3: miss ≤ α | A3: measured TV ≤ α (95% upper) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['d']} | {r['gauss_miss']:.0f} | {r['gauss_tv']:.0f} | {r['lap_miss']:.0f} | "
              f"{r['lap_tv']:.0f} | {r['a3_miss']:.0f} | {r['a3_tv']:.0f} |")
    big = [r for r in rows if r["d"] >= 32]
    sl = {k: slope([r["d"] for r in big], [r[k] for r in big])
          for k in ("gauss_miss", "gauss_tv", "lap_miss", "lap_tv", "a3_miss", "a3_tv")}
    print("\nslopes in d for d ≥ 32: " + ", ".join(f"{k} {v:.2f}" for k, v in sl.items()))
    print("n/d at the largest d: " + ", ".join(f"{k} {rows[-1][k] / rows[-1]['d']:.0f}"
                                                for k in sl))

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    ax = axes[0]
    for k, lab, st in (("gauss_miss", "Gaussian marginals: mass outside ≤ α", "o-"),
                       ("gauss_tv", "Gaussian marginals: TV ≤ α", "o--"),
                       ("lap_miss", "per-coord. Laplace: mass outside ≤ α", "s-"),
                       ("lap_tv", "per-coord. Laplace: TV ≤ α", "s--"),
                       ("a3_miss", "A3: mass outside ≤ α", "^-"),
                       ("a3_tv", "A3: measured TV ≤ α", "^--")):
        ax.plot(ds, [r[k] for r in rows], st, ms=4, label=lab)
    dd = np.array(ds, float)
    ax.plot(dd, rows[0]["gauss_miss"] * dd / ds[0], "k:", label="Ω(d) shape (∝ d)")
    ax.set(xscale="log", yscale="log", xlabel="d", ylabel="n needed",
           title=f"Thm 1.7 instance (bias 2/d on d/2 coords), ε={EPS:g}, α={ALPHA}")
    ax.legend(fontsize=7)
    ax = axes[1]
    d = 64
    p = dist.subset_product(d // 2)
    ns = np.unique(np.logspace(2, 6, 25).astype(int))
    for s, lab in ((gau, "Gaussian marginals"), (lap, "per-coord. Laplace")):
        ax.plot(ns, [support_miss_product(s.exact_marginals(int(n), p), p) for n in ns],
                label=lab)
    ns3 = ns[::3]
    ax.plot(ns3, [_a3_eval(d, n, reps, 7, 2000)["miss"] for n in ns3], "^-", label="A3")
    ax.axhline(ALPHA, color="gray", ls=":")
    ax.set(xscale="log", yscale="log", xlabel="n",
           ylabel="Pr[a one on some bias-0 coordinate]",
           title=f"mass outside the support, d = {d} (P gives it 0)")
    ax.set_ylim(1e-4, 1.1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(img / "sampling_lower_bound_general.png", dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------- B

def _worst_tv(s, n: int, d: int) -> float:
    from scipy.stats import binom

    """Exact TV when every bias is 1/3 (the worst case of every coordinate): identical
    coordinates, so TV = TV(Bin(d, q), Bin(d, 1/3))."""
    q = float(s.exact_marginals(n, np.full(d, 1 / 3))[0])  # identical biases: cached
    k = np.arange(d + 1)
    return 0.5 * float(np.abs(binom.pmf(k, d, q) - binom.pmf(k, d, 1 / 3)).sum())


def section_b(img: Path) -> None:
    print("\n## B. Theorem 1.9 (bounded biases): n needed against √d/ε\n")
    ds = [1, 4, 16, 64, 256, 1024, 4096, 16384]
    print("| ε | d | clipped mean n (private ∧ accurate) | Gaussian marginals n (TV ≤ α) | "
          "√d/ε | clipped n·ε/√d | Gaussian n·ε/√d |")
    print("|---|---|---|---|---|---|---|")
    res = {}
    for eps in (0.25, 1.0):
        cm, gm = [], []
        for d in ds:
            cms = ClippedMeanSampler(delta=DELTA)
            n_acc = minimal_n(lambda n, d=d, c=cms: _worst_tv(c, int(n), d), ALPHA, 2.0, 1e9,
                              rel_tol=0.01, integer=True)
            n_cm = max(bounds.clipped_mean_min_n(d, eps, DELTA), int(n_acc))
            g = GaussianMarginalSampler(eps, DELTA)
            n_g = minimal_n(lambda n, g=g, d=d: _worst_tv(g, int(n), d), ALPHA, 2.0,
                            1e9, rel_tol=0.01, integer=True)
            cm.append(n_cm)
            gm.append(n_g)
            print(f"| {eps:g} | {d} | {n_cm} | {n_g:.0f} | {math.sqrt(d) / eps:.0f} | "
                  f"{n_cm * eps / math.sqrt(d):.1f} | {n_g * eps / math.sqrt(d):.1f} |")
        res[eps] = (cm, gm)
        big = [i for i, d in enumerate(ds) if d >= 64]
        print(f"\nε = {eps:g}: slopes in d (d ≥ 64): clipped mean "
              f"{slope([ds[i] for i in big], [cm[i] for i in big]):.3f}, Gaussian marginals "
              f"{slope([ds[i] for i in big], [gm[i] for i in big]):.3f}\n")
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    for j, eps in enumerate((0.25, 1.0)):
        cm, gm = res[eps]
        ax.plot(ds, cm, "o-", color=f"C{j}", label=f"clipped mean, ε={eps:g}")
        ax.plot(ds, gm, "s--", color=f"C{j}", label=f"Gaussian marginals, ε={eps:g}")
        dd = np.array(ds, float)
        ax.plot(dd, np.sqrt(dd) / eps, ":", color=f"C{j}", label=f"√d/ε, ε={eps:g}")
    ax.set(xscale="log", yscale="log", xlabel="d", ylabel="n needed (α = 0.1, δ = 1e-6)",
           title="Thm 1.9: bounded biases need Ω(√d/ε); measured n")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(img / "sampling_lower_bound_bounded.png", dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------- C, D

def section_cd(img: Path) -> None:
    print("\n## C. Claim 16: learner with error α ⇒ 2α-accurate sampler (A1, k = 10, ε = 1)\n")
    s = LaplaceHistogramSampler(10, 1.0)
    print("| instance | n | learner α | E d_TV(P̃, P) | sampler TV (exact) | 2α | TV / (2α) |")
    print("|---|---|---|---|---|---|---|")
    inst = {"half support": dist.half_support(10), "point mass": dist.point_mass(10),
            "spiky": dist.spiky(10)}
    for name, p in inst.items():
        for n in (30, 100, 300, 1000, 3000):
            c = claim16_check(s, p, n, 20000, np.random.default_rng(n))
            print(f"| {name} | {n} | {c.learner_alpha:.4f} | {c.mean_learning_error:.4f} | "
                  f"{c.sampler_tv:.4f} | {2 * c.learner_alpha:.4f} | "
                  f"{c.sampler_tv / (2 * c.learner_alpha):.3f} |")

    print("\n## D. Zero-bias principle (F9): where A1's TV comes from (k = 10, ε = 1)\n")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    print("| instance | n | TV | absent part | present part | learner E d_TV(P̃,P) |")
    print("|---|---|---|---|---|---|")
    for ax, name in zip(axes, ("half support", "spiky"), strict=True):
        p = inst[name]
        ns = np.unique(np.logspace(1, 4, 16).astype(int))
        decs, learn = [], []
        for n in ns:
            decs.append(bias_decomposition(exact_output_law_poisson(s, p, float(n)), p, n))
            learn.append(claim16_check(s, p, n, 4000, np.random.default_rng(int(n)))
                         .mean_learning_error)
        for n, dec, le in zip(ns, decs, learn, strict=True):
            if n in (10, 100, 1000, 10000):
                print(f"| {name} | {n} | {dec.tv:.5f} | {dec.absent:.5f} | {dec.present:.5f} | "
                      f"{le:.4f} |")
        ax.plot(ns, [d.tv for d in decs], "k-", label="sampler TV (exact)")
        ax.plot(ns, [d.absent for d in decs], "C3--", label="… on elements absent from P")
        ax.plot(ns, [d.present for d in decs], "C0--", label="… on elements present in P")
        ax.plot(ns, learn, "C2o-", ms=3, label="learner's mean error E d_TV(P̃, P)")
        ax.plot(ns, 10 / ns, "k:", label="bound k/(εn)")
        ax.set(xscale="log", yscale="log", xlabel="n (Poisson)", ylabel="total variation",
               title=f"A1 on the {name} instance: error is projection bias only")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(img / "sampling_zero_bias.png", dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------- E

def section_e(img: Path, reps: int) -> None:
    print("\n## E. A3 on Theorem 1.7's instance: measured TV with 95% intervals (item 8)\n")
    print("| d | n | A3 rigorous upper bound | A3 measured TV [95%] | A3 lower (mass outside) | "
          "Gaussian marginals measured TV [95%] |")
    print("|---|---|---|---|---|---|")
    grids = {256: [20000, 40000, 80000, 160000], 1024: [100000, 200000, 400000, 800000],
             4096: [400000, 800000, 1600000, 3200000]}
    gau = GaussianMarginalSampler(EPS, DELTA)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    summary = []
    for ax, (d, ns) in zip(axes, grids.items(), strict=True):
        p = dist.subset_product(d // 2)
        s = BucketedProductSampler(EPS, DELTA, ALPHA)
        ub, mt, lo, hi, lb, gt, glo, ghi = ([] for _ in range(8))
        for n in ns:
            t0 = time.time()
            rng = np.random.default_rng(d + n)
            pm = bucketed_marginals(s, p, n, reps, rng)
            trunc = float(pm.truncation.mean())
            up = float(np.mean([min(1.0, t + product_tv(q, p).value)
                                for q, t in zip(pm.q, pm.truncation, strict=True)]))
            est = mixture_tv_monte_carlo(pm.q, p, 20000, np.random.default_rng(n))
            g = mixture_tv_monte_carlo(gau.exact_marginals(n, p)[None, :], p, 20000,
                                       np.random.default_rng(n + 1))
            ub.append(up)
            mt.append(est.estimate + trunc)
            lo.append(max(0.0, est.lower - trunc))
            hi.append(min(1.0, est.upper + trunc))
            lb.append(mixture_support_miss(pm, p))
            gt.append(g.estimate)
            glo.append(g.lower)
            ghi.append(g.upper)
            print(f"| {d} | {n} | {up:.4f} | {mt[-1]:.4f} [{lo[-1]:.4f}, {hi[-1]:.4f}] | "
                  f"{lb[-1]:.4f} | {g.estimate:.4f} [{g.lower:.4f}, {g.upper:.4f}] |  "
                  f"<!-- {time.time() - t0:.0f}s -->", flush=True)
        ax.plot(ns, ub, "C0:", label="A3 rigorous upper bound (Σ|bias| based)")
        ax.errorbar(ns, mt, yerr=[np.array(mt) - lo, np.array(hi) - mt], fmt="C0o-",
                    label="A3 measured TV (95%)")
        ax.plot(ns, lb, "C0^--", label="A3 lower bound (mass outside)")
        ax.errorbar(ns, gt, yerr=[np.array(gt) - glo, np.array(ghi) - gt], fmt="C1s-",
                    label="Gaussian marginals measured TV (95%)")
        ax.axhline(ALPHA, color="gray", ls=":")
        ax.set(xscale="log", yscale="log", xlabel="n", ylabel="TV", title=f"d = {d}")
        ax.legend(fontsize=6)
        # n at which the measured TV crosses α (log-log interpolation)
        summary.append((d, _cross(ns, mt), _cross(ns, hi), _cross(ns, gt), _cross(ns, ub)))
    fig.tight_layout()
    fig.savefig(img / "sampling_a3_measured_tv.png", dpi=120)
    plt.close(fig)
    print("\n| d | A3 n for measured TV = α | (95% upper = α) | Gaussian marginals | "
          "A3 by the rigorous upper bound |")
    print("|---|---|---|---|---|")
    for row in summary:
        print("| " + " | ".join(f"{v:.0f}" if isinstance(v, float) else str(v)
                                 for v in row) + " |")
    if len(summary) >= 2 and all(math.isfinite(r[1]) for r in summary[-2:]):
        (d1, a1, _, g1, u1), (d2, a2, _, g2, u2) = summary[-2:]
        span = math.log(d2 / d1)
        print(f"\nslopes between d = {d1} and {d2}: A3 measured "
              f"{math.log(a2 / a1) / span:.2f}, Gaussian marginals "
              f"{math.log(g2 / g1) / span:.2f}, A3 upper bound {math.log(u2 / u1) / span:.2f}")


def _cross(ns, ys) -> float:
    """n at which y crosses α (log-log interpolation between grid points); nan if not."""
    for i in range(len(ns) - 1):
        if ys[i] > ALPHA >= ys[i + 1]:
            t = (math.log(ALPHA) - math.log(ys[i])) / (math.log(ys[i + 1]) - math.log(ys[i]))
            lo, hi = math.log(ns[i]), math.log(ns[i + 1])
            return float(math.exp(lo + t * (hi - lo)))
    return math.nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--img", type=Path, default=Path(__file__).resolve().parents[1]
                    / "docs" / "img")
    ap.add_argument("--reps", type=int, default=6, help="A3 bucketing plans per point")
    ap.add_argument("--sections", default="ABCDE")
    args = ap.parse_args()
    args.img.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for sec, fn in (("B", lambda: section_b(args.img)), ("C", lambda: section_cd(args.img)),
                    ("A", lambda: section_a(args.img, args.reps)),
                    ("E", lambda: section_e(args.img, args.reps))):
        if sec in args.sections:
            t = time.time()
            fn()
            print(f"\n(section {sec}{'+D' if sec == 'C' else ''}: {time.time() - t:.0f} s)",
                  flush=True)
    print(f"\ntotal {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
