"""Private sampling of product distributions on {0,1}^d: √d (bounded bias) vs d (general).

    .venv/bin/python benchmarks/sampling_products.py [--img docs/img] [--reps 16]

Everything is synthetic; ε = 1, δ = 1e-6, target α = 0.1 unless stated. Prints markdown
tables and writes docs/img/sampling_products_*.png. Sections:

A. the clipped-mean sampler's exact per-coordinate ε₁(n) against ln(1 + 4/n) and 4/n, and its
   exact worst-case TV for d = 1 against the Hoeffding bound ½e^{−n/72};
B. bounded biases: n needed for (ε, δ)-DP (exact ε₁, composed by zCDP / advanced composition)
   and for α-accuracy (exact worst-case TV over biases in [1/3, 2/3]) as d grows to 10⁵;
C. general products (Theorem 1.7's instance: bias 1/k on k of d = 2k coordinates): n needed
   for TV ≤ α by the bucketed sampler (A3; semi-analytic upper bound, Monte Carlo over its
   bucketing), the per-coordinate Laplace and the Gaussian marginal samplers (exact);
D. all samplers on three instances at d = 32.
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
from scipy.stats import binom

from dplang.sampling import (
    BucketedProductSampler,
    ClippedMeanSampler,
    GaussianMarginalSampler,
    PerCoordinateLaplaceSampler,
    bounds,
)
from dplang.sampling import distributions as dist
from dplang.sampling.evaluation import bucketed_product_tv, minimal_n, product_tv

EPS, DELTA, ALPHA = 1.0, 1e-6, 0.1


def slope(x, y) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def section_a(img: Path) -> None:
    print("\n## A. clipped-mean sampler: exact ε₁(n) and d = 1 accuracy\n")
    s = ClippedMeanSampler()
    ns = np.arange(4, 201)
    e1 = [s.epsilon_per_coordinate(int(n)) for n in ns]
    print("| n | ε₁(n) exact | ln(1+4/n) | 4/n | worst-case TV (d=1, p ∈ [1/3,2/3]) | "
          "½e^{−n/72} |")
    print("|---|---|---|---|---|---|")
    for n in (4, 5, 6, 7, 10, 50, 100, 200, 400):
        print(f"| {n} | {s.epsilon_per_coordinate(n):.5f} | {math.log1p(4 / n):.5f} | "
              f"{4 / n:.5f} | {s.worst_case_bias(n):.3g} | {0.5 * math.exp(-n / 72):.3g} |")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].plot(ns, e1, ".", ms=3, label="exact ε₁(n)")
    axes[0].plot(ns, np.log1p(4 / ns), "-", lw=1, label="ln(1+4/n)")
    axes[0].plot(ns, 4 / ns, "--", lw=1, label="4/n")
    axes[0].set(xscale="log", yscale="log", xlabel="n", ylabel="per-coordinate ε",
                title="clipped mean: ε₁(n) = ln(1+4/n) when 4 | n")
    axes[0].legend()
    nn = np.arange(5, 401, 5)
    axes[1].semilogy(nn, [s.worst_case_bias(int(n)) for n in nn], label="exact worst-case TV")
    axes[1].semilogy(nn, 0.5 * np.exp(-nn / 72), "--", label="Hoeffding ½e^{−n/72}")
    axes[1].set(xlabel="n", ylabel="TV (d = 1)", title="clipped mean, biases in [1/3, 2/3]")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(img / "sampling_products_clipped_mean.png", dpi=130)
    plt.close(fig)


def _worst_product_tv(s: ClippedMeanSampler, n: int, d: int) -> float:
    """Exact TV between the output law and P when every bias is 1/3 (the worst case of each
    coordinate): both are products of identical Bernoullis, so TV = TV(Bin(d, q), Bin(d, p))."""
    q = float(s.exact_marginals(n, np.array([1 / 3]))[0])
    m = np.arange(d + 1)
    return 0.5 * float(np.abs(binom.pmf(m, d, q) - binom.pmf(m, d, 1 / 3)).sum())


def section_b(img: Path) -> None:
    print(f"\n## B. bounded biases: n needed vs d (ε = {EPS}, δ = {DELTA:g}, α = {ALPHA})\n")
    print("| d | n_priv zCDP | n_priv advanced | n_priv best | n_acc (exact) | n = max | "
          "closed form (claim 12) | learning d/α² |")
    print("|---|---|---|---|---|---|---|---|")
    ds = [1, 3, 10, 30, 100, 300, 1000, 3000, 10_000, 30_000, 100_000]
    s = ClippedMeanSampler()
    rows = []
    for d in ds:
        # d = 1 is pure ε₁-DP (no δ): every accountant gives the same n
        priv = {a: bounds.clipped_mean_min_n(d, EPS, DELTA, a)
                for a in ("zcdp", "advanced", "best")}
        n_acc = bounds.min_n(lambda n, d=d: _worst_product_tv(s, n, d) <= ALPHA)
        total = max(priv["best"], n_acc)
        closed = bounds.bb_upper_n(d, ALPHA, EPS, DELTA if d > 1 else None)
        rows.append((d, priv, n_acc, total))
        print(f"| {d} | {priv['zcdp']} | {priv['advanced']} | {priv['best']} | {n_acc} | "
              f"{total} | {closed} | {d / ALPHA**2:.0f} |")
    big = [r for r in rows if r[0] >= 100]
    sp = slope([r[0] for r in big], [r[1]["best"] for r in big])
    sa = slope([r[0] for r in big], [r[2] for r in big])
    print(f"\nlog–log slope for d ≥ 100: n_priv {sp:.3f} (theory 0.5), n_acc {sa:.3f} "
          f"(theory: logarithmic in d)")
    fig, ax = plt.subplots(figsize=(6.2, 4.5))
    d_arr = np.array([r[0] for r in rows])
    ax.loglog(d_arr, [r[1]["best"] for r in rows], "o-", label=f"privacy n (slope {sp:.2f})")
    ax.loglog(d_arr, [r[2] for r in rows], "s-", label="accuracy n (exact)")
    ax.loglog(d_arr, [r[3] for r in rows], "k-", lw=2, alpha=0.4, label="clipped mean: max")
    ax.loglog(d_arr, d_arr / ALPHA**2, ":", label="learning ~ d/α² (reference)")
    ax.set(xlabel="d", ylabel="n", title="bounded biases: n ~ √d (sampling) vs d")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(img / "sampling_products_bounded_bias.png", dpi=130)
    plt.close(fig)


def _a3_tv(d: int, n: float, reps: int, seed: int, c_t: float = 3.0) -> dict[str, float]:
    s = BucketedProductSampler(EPS, DELTA, alpha=ALPHA, c_T=c_t)
    # common random numbers: the same seed for every n makes the bisection stable
    return bucketed_product_tv(s, dist.subset_product(d // 2), int(n), reps,
                               np.random.default_rng(seed))


def section_c(img: Path, reps: int) -> dict[int, float]:
    print(f"\n## C. general products, Theorem 1.7's instance (bias 2/d on d/2 coordinates, 0 "
          f"elsewhere): n for TV ≤ {ALPHA}\n")
    print("A3: TV upper bound E[Pr(truncation) + TV(⊗Ber(q|plan), P)] estimated over "
          f"{reps} bucketings (its 95% upper limit in brackets); marginal samplers: exact "
          "product laws, TV exact for d ≤ 16 and its upper bound min(Σ|q_j−p_j|, √(1−BC²)) "
          "beyond.\n")
    print("| d | A3 n_min | A3 TV bound at n_min [95% upper] | A3 lower bound at n_min | "
          "A3 buckets | A3 (c_T = 1) n_min | Laplace marginals n_min | Gaussian marginals "
          "n_min | clipped mean TV at n=10⁶ |")
    print("|---|---|---|---|---|---|---|---|---|")
    ds = [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    a3, a3b, lap, gau = [], [], [], []
    lap_s = PerCoordinateLaplaceSampler(EPS)
    gau_s = GaussianMarginalSampler(EPS, DELTA)
    cm = ClippedMeanSampler()
    for d in ds:
        p = dist.subset_product(d // 2)
        m3 = minimal_n(lambda n, d=d: _a3_tv(d, n, reps, 1000 + d)["upper"], ALPHA, 100.0,
                       1e8, rel_tol=0.02)
        info = _a3_tv(d, m3, reps, 1000 + d)
        m3b = minimal_n(lambda n, d=d: _a3_tv(d, n, reps, 1000 + d, 1.0)["upper"], ALPHA, 100.0,
                        1e8, rel_tol=0.02)
        ml = minimal_n(lambda n, p=p: product_tv(lap_s.exact_marginals(int(n), p), p).value,
                       ALPHA, 2.0, 1e10, rel_tol=0.01)
        mg = minimal_n(lambda n, p=p: product_tv(gau_s.exact_marginals(int(n), p), p).value,
                       ALPHA, 2.0, 1e10, rel_tol=0.01)
        cm_tv = product_tv(cm.exact_marginals(10**6, p), p)
        a3.append(m3)
        a3b.append(m3b)
        lap.append(ml)
        gau.append(mg)
        print(f"| {d} | {m3:.0f} | {info['upper']:.3f} [{info['upper_limit']:.3f}] | "
              f"{info['lower']:.4f} | {info['buckets']:.1f} | {m3b:.0f} | {ml:.0f} | {mg:.0f} | "
              f"≥ {cm_tv.lower:.3f} |")
    s3, sl, sg = slope(ds, a3), slope(ds, lap), slope(ds, gau)
    print(f"\nlog–log slopes of n_min in d over all d: A3 {s3:.2f}, A3 (c_T = 1) "
          f"{slope(ds, a3b):.2f}, Laplace marginals {sl:.2f} (theory 2), Gaussian marginals "
          f"{sg:.2f} (theory 1.5)")
    for lo_d, hi_d in ((4, 256), (256, 4096), (1024, 4096)):
        i, j = ds.index(lo_d), ds.index(hi_d) + 1
        print(f"- d ∈ [{lo_d}, {hi_d}]: A3 {slope(ds[i:j], a3[i:j]):.2f}, A3 (c_T = 1) "
              f"{slope(ds[i:j], a3b[i:j]):.2f}, Laplace {slope(ds[i:j], lap[i:j]):.2f}, "
              f"Gaussian {slope(ds[i:j], gau[i:j]):.2f}")
    fig, ax = plt.subplots(figsize=(6.2, 4.5))
    ax.loglog(ds, a3, "o-", label=f"A3 bucketed, c_T = 3 (slope {s3:.2f})")
    ax.loglog(ds, a3b, "o--", label=f"A3 bucketed, c_T = 1 (slope {slope(ds, a3b):.2f})")
    ax.loglog(ds, 30 * np.array(ds, dtype=float) * np.log(ds), "k:", lw=1,
              label="reference ∝ d·log d")
    ax.loglog(ds, lap, "s-", label=f"per-coordinate Laplace (slope {sl:.2f})")
    ax.loglog(ds, gau, "^-", label=f"Gaussian marginals (slope {sg:.2f})")
    ax.set(xlabel="d", ylabel=f"n for TV ≤ {ALPHA}",
           title="general products (ε = 1, δ = 1e-6)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(img / "sampling_products_general.png", dpi=130)
    plt.close(fig)
    return dict(zip(ds, a3, strict=True))


def section_d(reps: int) -> None:
    d = 32
    print(f"\n## D. all product samplers at d = {d} (TV; A3 upper bound over {reps} "
          "bucketings)\n")
    rng = np.random.default_rng(32)
    instances = {"subset (Thm 1.7)": dist.subset_product(d // 2),
                 "biases U[0,1]": dist.random_biases(d, rng),
                 "biases U[1/3,2/3]": dist.random_bounded_biases(d, rng)}
    samplers = {"clipped mean": ClippedMeanSampler(),
                "Laplace marginals": PerCoordinateLaplaceSampler(EPS),
                "Gaussian marginals": GaussianMarginalSampler(EPS, DELTA)}
    ns = [2000, 8000, 32000]
    print("| instance | sampler | " + " | ".join(f"n={n}" for n in ns) + " |")
    print("|---|---|" + "---|" * len(ns))
    a3 = BucketedProductSampler(EPS, DELTA, alpha=ALPHA)
    for name, p in instances.items():
        for sname, s in samplers.items():
            vals = [product_tv(s.exact_marginals(n, p), p).value for n in ns]
            print(f"| {name} | {sname} | " + " | ".join(f"{v:.3g}" for v in vals) + " |")
        vals = [bucketed_product_tv(a3, p, n, reps, np.random.default_rng(n))["upper"]
                for n in ns]
        print(f"| {name} | A3 bucketed (upper bound) | " + " | ".join(f"{v:.3g}" for v in vals)
              + " |")
    print("\n(clipped mean is (ε₁(n)·composition)-DP, not ε = 1: at d = 32, δ = 1e-6 its ε is "
          + ", ".join(f"{ClippedMeanSampler(delta=DELTA).guarantee(n, d).epsilon:.3g} at n={n}"
                      for n in ns) + ")")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img", type=Path, default=Path("docs/img"))
    parser.add_argument("--reps", type=int, default=16)
    args = parser.parse_args()
    args.img.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    section_a(args.img)
    t = time.time()
    section_b(args.img)
    print(f"\n_section time {time.time() - t:.0f} s_")
    t = time.time()
    section_c(args.img, args.reps)
    print(f"\n_section time {time.time() - t:.0f} s_")
    t = time.time()
    section_d(args.reps)
    print(f"\n_section time {time.time() - t:.0f} s_")
    print(f"\ntotal time {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
