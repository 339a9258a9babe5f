"""k-ary private sampling: Table 1's Θ(k/(αε)) rate and Lemma 2.1, measured exactly.

    .venv/bin/python benchmarks/sampling_kary.py [--img docs/img]

Everything is synthetic. Unless stated, TV distances are EXACT (no Monte Carlo): the
Laplace-histogram sampler (A1) is run as a Poisson sampler (dataset size N ~ Po(n), the
setting of the paper's lower bound), whose output law is one numerical integral
(dplang.sampling.evaluation.exact_output_law_poisson); reveal-or-obscure has a closed form.
Section B checks that fixed-n datasets give the same numbers (Monte Carlo, 95% intervals).

Prints markdown tables and writes docs/img/sampling_kary_*.png. Sections:
A. TV vs n for three instances, with the bound k/(εn), and the collapsed TV·εn/k.
B. fixed n (Monte Carlo) against Poisson n (exact).
C. minimal n for TV ≤ α as k, 1/ε and 1/α grow (log–log slopes).
D. Lemma 2.1's instance (α ≤ 1/60): TV and Pr[output ∉ supp P] at n = k/(60αε), and the
   minimal n, against k/(αε).
E. the Bernoulli lower bound instance Ber(10α).
F. sampling versus learning (the k/α² term appears only for learning).
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
from matplotlib.ticker import NullFormatter

from dplang.sampling import (
    LaplaceHistogramSampler,
    RevealOrObscureSampler,
    bounds,
)
from dplang.sampling import distributions as dist
from dplang.sampling.evaluation import (
    claim24_probability,
    estimate_tv,
    exact_output_law_poisson,
    learning_error_quantile,
    minimal_n,
    support_miss_probability,
    tv_distance,
)

INSTANCES = {"point mass": dist.point_mass, "half support": dist.half_support,
             "spiky": dist.spiky}


def tv_a1(k: int, eps: float, p: np.ndarray, n: float) -> float:
    return tv_distance(exact_output_law_poisson(LaplaceHistogramSampler(k, eps), p, n), p)


def tv_roo_fixed(k: int, eps: float, p: np.ndarray, n: float) -> float:
    q = RevealOrObscureSampler(k, eps).mixing_probability(max(1, round(n)))
    return q * tv_distance(dist.uniform(k), p)


def slope(x: list[float], y: list[float]) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def section_a(img: Path) -> None:
    print("\n## A. TV vs n (A1 exact, Poisson sizes; ε = 1)\n")
    ns = np.unique(np.round(np.logspace(1, 5, 13))).astype(float)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    print("| k | instance | " + " | ".join(f"n={int(n)}" for n in ns[::3]) + " |")
    print("|---|---|" + "---|" * len(ns[::3]))
    for k, ls in ((10, "-"), (50, "--")):
        for (name, make), color in zip(INSTANCES.items(), ("C0", "C1", "C2"), strict=True):
            p = make(k)
            tvs = [tv_a1(k, 1.0, p, n) for n in ns]
            axes[0].loglog(ns, tvs, ls, color=color, label=f"A1 {name}, k={k}")
            axes[1].semilogx(ns, np.array(tvs) * ns / k, ls, color=color,
                             label=f"A1 {name}, k={k}")
            print(f"| {k} | {name} | " + " | ".join(f"{t:.3g}" for t in tvs[::3]) + " |")
        axes[0].loglog(ns, np.minimum(1, k / ns), ":", color="k", lw=1)
        roo = [tv_roo_fixed(k, 1.0, dist.point_mass(k), n) for n in ns]
        axes[1].semilogx(ns, np.array(roo) * ns / k, ls, color="C3",
                         label=f"ROO point mass, k={k}")
    axes[0].set(xlabel="n", ylabel="d_TV(Q, P)", title="A1: exact TV (dotted: k/(εn))")
    axes[1].axhline(1.0, color="k", lw=1, ls=":")
    axes[1].set(xlabel="n", ylabel="TV·εn/k", ylim=(0, 1.1),
                title="collapsed: A1 ≤ 1 (Thm 1.4 bound)")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(img / "sampling_kary_tv_vs_n.png", dpi=130)
    plt.close(fig)


def section_b() -> None:
    print("\n## B. fixed n (Monte Carlo, 95% CI) vs Poisson n (exact); A1, ε = 1\n")
    print("| k | instance | n | fixed-n TV [95% CI] | Poisson TV (exact) | bound k/(εn) |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(2021)
    for k, name, n in ((10, "spiky", 100), (10, "spiky", 1000), (50, "spiky", 100),
                       (50, "spiky", 1000), (10, "point mass", 100), (50, "half support", 300)):
        p = INSTANCES[name](k)
        est = estimate_tv(LaplaceHistogramSampler(k, 1.0), p, n, 100_000, rng)
        exact = tv_a1(k, 1.0, p, n)
        print(f"| {k} | {name} | {n} | {est.tv:.4f} [{est.lower:.4f}, {est.upper:.4f}] | "
              f"{exact:.4f} | {k / n:.3g} |")


def section_c(img: Path) -> dict[str, float]:
    print("\n## C. minimal n with TV ≤ α (A1 exact, Poisson sizes; ROO exact, fixed n)\n")
    out = {}
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    sweeps = {
        "k": ([4, 8, 16, 32, 64, 128, 256], lambda v: (v, 1.0, 0.05)),
        "1/ε": ([0.5, 1, 2, 4, 8], lambda v: (16, 1.0 / v, 0.05)),
        "1/α": ([5, 10, 20, 40, 80], lambda v: (16, 1.0, 1.0 / v)),
    }
    print("| sweep | value | instance | n_min (A1) | n_min·αε/k | n_min (ROO) |")
    print("|---|---|---|---|---|---|")
    for ax, (label, (values, params)) in zip(axes, sweeps.items(), strict=True):
        for name, color in (("point mass", "C0"), ("half support", "C1")):
            mins, roos = [], []
            for v in values:
                k, eps, alpha = params(v)
                p = INSTANCES[name](k)
                hi = 4 * k / (alpha * eps)
                m = minimal_n(lambda n, k=k, eps=eps, p=p: tv_a1(k, eps, p, n), alpha,
                              1.0, hi, rel_tol=0.01)
                r = minimal_n(lambda n, k=k, eps=eps, p=p: tv_roo_fixed(k, eps, p, n), alpha,
                              1.0, hi, rel_tol=1e-4, integer=True)
                mins.append(m)
                roos.append(r)
                print(f"| {label} | {v:g} | {name} | {m:.0f} | {m * alpha * eps / k:.3f} | "
                      f"{r:.0f} |")
            s = slope(values, mins)
            out[f"{label} {name}"] = s
            ax.loglog(values, mins, "o-", color=color, label=f"A1 {name} (slope {s:.2f})")
            ax.loglog(values, roos, "s--", color=color, alpha=0.6,
                      label=f"ROO {name} (slope {slope(values, roos):.2f})")
        k0, e0, a0 = zip(*(params(v) for v in values), strict=True)
        ax.loglog(values, [k / (a * e) for k, e, a in zip(k0, e0, a0, strict=True)], "k:",
                  label="k/(αε)")
        ax.set(xlabel=label, ylabel="n for TV ≤ α", title=f"n_min vs {label}")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(img / "sampling_kary_rates.png", dpi=130)
    plt.close(fig)
    print("\nlog–log slopes of n_min (theory: 1 for k, 1 for 1/ε, 1 for 1/α):")
    for key, s in out.items():
        print(f"- {key}: {s:.3f}")
    return out


def section_d(img: Path) -> None:
    print("\n## D. Lemma 2.1 instance on [2k+1] (A1 run as a Poisson sampler; exact)\n")
    print("| k | α | ε | n_L = k/(60αε) | TV at n_L | Pr[A ∉ supp P] at n_L | Claim 2.4 "
          "Pr[Y/k > e³] | n_min (TV ≤ α) | n_min/(k/(αε)) | n_min ROO/(k/(αε)) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(60)
    configs = [(5, 0.01, None), (10, 0.01, None), (20, 0.01, None), (50, 0.01, None),
               (10, 1 / 60, None), (10, 0.005, None), (10, 0.01, 0.25), (20, 0.005, 0.5)]
    xs, ys, yr = [], [], []
    for k, alpha, frac in configs:
        eps = (frac or 1.0) / math.log(1 / alpha)
        p = dist.lemma21_instance(k, alpha)
        s = LaplaceHistogramSampler(2 * k + 1, eps)
        n_low = bounds.kary_lower_n(k, alpha, eps)
        q = exact_output_law_poisson(s, p, n_low)
        c24 = claim24_probability(k, n_low, alpha, eps, 20_000, rng)
        ref = k / (alpha * eps)
        m = minimal_n(lambda n, s=s, p=p: tv_distance(exact_output_law_poisson(s, p, n), p),
                      alpha, n_low, 4 * ref, rel_tol=0.01)
        roo = RevealOrObscureSampler(2 * k + 1, eps)
        mr = minimal_n(lambda n, roo=roo, p=p: tv_distance(exact_output_law_poisson(roo, p, n),
                                                            p), alpha, n_low, 40 * ref,
                       rel_tol=0.01)
        xs.append(ref)
        ys.append(m)
        yr.append(mr)
        print(f"| {k} | {alpha:.4g} | {eps:.4f} | {n_low:.0f} | {tv_distance(q, p):.3f} | "
              f"{support_miss_probability(q, p):.3f} | {c24:.4f} | {m:.0f} | {m / ref:.3f} | "
              f"{mr / ref:.3f} |")
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    ax.loglog(xs, ys, "o", label="A1: minimal n (exact)")
    ax.loglog(xs, yr, "s", label="ROO: minimal n (exact)")
    grid = np.array([min(xs) / 1.5, max(xs) * 1.5])
    ax.loglog(grid, grid, "k:", label="k/(αε)")
    ax.loglog(grid, grid / 60, "k--", label="Lemma 2.1 lower bound k/(60αε)")
    ax.set(xlabel="k/(αε)", ylabel="n needed for TV ≤ α",
           title="Lemma 2.1 instance: Ω(k/(αε))")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(img / "sampling_kary_lemma21.png", dpi=130)
    plt.close(fig)


def section_e() -> None:
    print("\n## E. Bernoulli instance Ber(10α) (A1 with k = 2, Poisson sizes; exact)\n")
    print("| α | ε | n_min (TV ≤ α) | lower ln(4.5)/(10α(e^ε−1)) | pure ln 9/(10α(e^ε−1)) | "
          "1/(αε) | n_min·αε |")
    print("|---|---|---|---|---|---|---|")
    for alpha in (0.01, 0.005, 0.0025):
        for eps in (1.0, 0.5, 0.25):
            p = dist.bernoulli_hard(alpha)
            m = minimal_n(lambda n, p=p, eps=eps: tv_a1(2, eps, p, n), alpha, 1.0,
                          20 / (alpha * eps), rel_tol=0.01)
            print(f"| {alpha:g} | {eps:g} | {m:.0f} | {bounds.bernoulli_lower_n(alpha, eps):.0f} "
                  f"| {bounds.bernoulli_lower_n(alpha, eps, pure=True):.0f} | "
                  f"{1 / (alpha * eps):.0f} | {m * alpha * eps:.3f} |")


def section_f(img: Path) -> None:
    print("\n## F. sampling vs learning (k = 10, ε = 1; noisy histogram with L1 projection)\n")
    print("Learning: smallest n with the (1−α)-quantile of TV(P̃, P) ≤ α (1000 Monte Carlo "
          "datasets per n); sampling: smallest n with TV(Q, P) ≤ α (exact, Poisson sizes).\n")
    print("| α | instance | n sampling | n learning | learning/sampling |")
    print("|---|---|---|---|---|")
    k, eps = 10, 1.0
    alphas = [0.2, 0.1, 0.05, 0.025]
    rng = np.random.default_rng(7)
    s = LaplaceHistogramSampler(k, eps)
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for name, color in (("uniform", "C0"), ("point mass", "C1")):
        p = dist.uniform(k) if name == "uniform" else dist.point_mass(k)
        samp, learn = [], []
        for alpha in alphas:
            ns = minimal_n(lambda n, p=p: tv_a1(k, eps, p, n), alpha, 1.0, 50 * k / alpha,
                           rel_tol=0.01) if name != "uniform" else 1.0
            nl = minimal_n(lambda n, p=p, alpha=alpha: learning_error_quantile(
                s, p, int(n), 1000, rng, 1 - alpha), alpha, 2.0, 40 * k / alpha**2,
                rel_tol=0.03, integer=True)
            samp.append(ns)
            learn.append(nl)
            print(f"| {alpha:g} | {name} | {ns:.0f} | {nl:.0f} | {nl / ns:.1f} |")
        ax.loglog([1 / a for a in alphas], learn, "o-", color=color,
                  label=f"learning, {name} (slope {slope([1 / a for a in alphas], learn):.2f})")
        if name != "uniform":
            ax.loglog([1 / a for a in alphas], samp, "s--", color=color,
                      label=f"sampling, {name} (slope "
                            f"{slope([1 / a for a in alphas], samp):.2f})")
    ax.set(xlabel="1/α", ylabel="n", title="k = 10, ε = 1: learning ~ k/α², sampling ~ k/(αε)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(img / "sampling_kary_learning.png", dpi=130)
    plt.close(fig)
    print("\n(On the uniform distribution the sampler is exact: Q = P for every n, so n = 1.)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img", type=Path, default=Path("docs/img"))
    args = parser.parse_args()
    args.img.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for section in (section_a, section_b, section_c, section_d, section_e, section_f):
        t = time.time()
        if section is section_b or section is section_e:
            section()
        else:
            section(args.img)
        print(f"\n_section time {time.time() - t:.0f} s_")
    print(f"\ntotal time {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
