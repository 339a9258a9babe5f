"""Paper 003 Table 1 on Yelp with the free-text DP baselines, all under the same metrics.

Corpus R: the first ``--records`` rows of ``shared/data/yelp/dev.csv`` (positions only). One
support predicate for every method, fixed before the data is read: the embedding predicate
(bundled all-MiniLM-L6-v2, one sentence per chunk, cosine ≥ ``--similarity``). θ = 0.05.
Every private method is ε = 10 DP with respect to **replacing one review** (the same neighbouring
relation for all rows of the table).

* **Unfiltered LLM** (ε = 0): the default model continues the public report prompt
  ("Summary of what customers commonly say in their reviews:"), ``--generations`` texts.
* **free-text DP (doc)** (``InvisibleInkReport``): InvisibleInk over the corpus with the report
  prompt, (ε, δ) = (10, 1e-5) under replace-one adjacency (calibrated at ρ/4 under
  replace-by-null), B = ``--batch-size`` reviews per generation, the first ``--generations``
  position batches, T = ``--max-tokens`` tokens, through dplang's public generation engine.
* **free-text DP (selection)** (``ExponentialSelectionReport``, spec option (c)): the
  exponential mechanism writes ``--sentences`` sentences of the proposal-and-filter schema, each
  chosen by its vote (support) count at ε/r; ``--replications`` independent draws on the same
  exact counts (evaluation only).
* **Proposal-and-Filter**: the same schema (68 statements), exact discrete-Laplace support
  tests, β = 0.05; ``--replications`` noise draws on the same exact counts.

Free-text outputs are parsed into claims by ``ClaimParser`` (sentences) and scored with the
predicate. FalseEmission, MeanSupport, UnsupportedEmit and EmitRate are pooled over runs
(generations / draws) with 95% bootstrap intervals over runs. For free text every parsed claim
is asserted (no abstention), so its UnsupportedEmit is 1 as soon as it makes one unsupported claim.

Run::

    .venv/bin/python benchmarks/reports_freetext_yelp.py --records 1000 --seed 0

Evaluation only: the printed supports are exact statistics of R (a public benchmark corpus).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from dplang.io import load_references
from dplang.privacy.randomness import RandomStreams
from dplang.reports.bootstrap import MetricCI, bootstrap_metrics, claim_metrics
from dplang.reports.evaluation import theorem_5_2_interval
from dplang.reports.freetext import (
    ClaimParser,
    ExponentialSelectionReport,
    InvisibleInkReport,
    PublicPromptReport,
    score_claims,
)
from dplang.reports.mechanism import FilterConfig, certify_counts
from dplang.reports.predicates import EmbeddingPredicate, support_counts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reports_yelp import DATA, SCHEMA


def row(name: str, runs: int, items: int, ci: dict[str, MetricCI]) -> str:
    return (f"| {name} | {runs} | {items} | {ci['false_emission']} | {ci['mean_support']} | "
            f"{ci['unsupported_emit']} | {ci['emit_rate']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--theta", type=float, default=0.05)
    parser.add_argument("--similarity", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--sentences", type=int, default=5)
    parser.add_argument("--replications", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-generation", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("/tmp/dplang_freetext_yelp.json"))
    args = parser.parse_args()
    t_start = time.time()
    streams = RandomStreams(args.seed)

    # ---- public choices, fixed before the data is read
    statements = SCHEMA.propose()
    predicate = EmbeddingPredicate(args.similarity, max_words=48, pack=False)
    config = FilterConfig(epsilon=args.epsilon, beta=0.05, theta=args.theta)
    parse = ClaimParser()

    records, _ = load_references(DATA, "text", (), limit=args.records)
    texts = [r.text for r in records]
    n, m = len(texts), len(statements)
    t0 = time.time()
    counts = support_counts(predicate, statements, texts)  # exact (evaluation only)
    f = counts / n
    timings = {"embed_seconds": round(time.time() - t0, 1)}
    print(f"corpus: first {n} rows of {DATA.name}; {m} schema statements; predicate "
          f"{predicate.id}; θ = {args.theta}; mean support of a schema statement "
          f"{f.mean():.3f}, p_θ = {(f >= args.theta).mean():.3f}")

    lines = ["| Method (ε, adjacency replace-one) | runs | claims / candidates | "
             "FalseEmit ↓ [95% CI] | MeanSupport ↑ [95% CI] | UnsupportedEmit [95% CI] | "
             "EmitRate [95% CI] |", "|---|---|---|---|---|---|---|"]
    samples: dict[str, list[tuple[str, float]]] = {}
    results: dict[str, dict] = {}

    if not args.skip_generation:
        from dplang.models import resolve_model

        t0 = time.time()
        model = resolve_model("default")
        timings["model_load_seconds"] = round(time.time() - t0, 1)
        gens = [PublicPromptReport(model, texts=args.generations, max_tokens=args.max_tokens),
                InvisibleInkReport(model, epsilon=args.epsilon, delta=1e-5,
                                   batch_size=args.batch_size, max_tokens=args.max_tokens,
                                   generations=args.generations)]
        for k, mech in enumerate(gens):
            t0 = time.time()
            out = mech.generate(texts, seed=args.seed + k)
            timings[f"{mech.name}_seconds"] = round(time.time() - t0, 1)
            claims = [parse(t) for t in out.texts]
            sup = score_claims(claims, predicate, texts)
            ci = claim_metrics(sup, args.theta, streams.generator(1, k))
            label = (f"{mech.name} (ε = {out.guarantee.epsilon:.3g}, "
                     f"δ = {out.guarantee.delta:g})")
            lines.append(row(label, len(out.texts), sum(len(c) for c in claims), ci))
            samples[mech.name] = [(c, float(s)) for cs, ss in zip(claims, sup, strict=True)
                                  for c, s in zip(cs, ss, strict=True)][:10]
            results[mech.name] = {"texts": out.texts, "claims": claims,
                                  "supports": [s.tolist() for s in sup],
                                  "guarantee": out.guarantee.summary(),
                                  "details": {**out.guarantee.details},
                                  "metrics": {k2: vars(v) for k2, v in ci.items()}}

    # ---- free-text DP by selection: replications on the exact counts (evaluation)
    sel = ExponentialSelectionReport(statements, predicate, args.epsilon, args.sentences)
    rng = streams.generator(2)
    chosen = np.zeros((args.replications, m), dtype=bool)
    for r in range(args.replications):
        chosen[r, sel.select(counts, rng)] = True
    ci = bootstrap_metrics(chosen, f, args.theta, streams.generator(3))
    lines.append(row(f"{sel.name}, r = {args.sentences} (ε = {args.epsilon:g}, δ = 0)",
                     args.replications, m, ci))
    results[sel.name] = {"metrics": {k: vars(v) for k, v in ci.items()}}

    # ---- proposal-and-filter: noise replications on the exact counts (evaluation)
    masks = [certify_counts(statements, counts, n, config,
                            RandomStreams(args.seed + 1000 + r)).emitted_mask
             for r in range(args.replications)]
    emitted = np.array(masks)
    ci = bootstrap_metrics(emitted, f, args.theta, streams.generator(4))
    test = certify_counts(statements, counts, n, config, RandomStreams(0)).test
    iv = theorem_5_2_interval(f, args.theta, test.tau, test.beta)
    lines.append(row(f"Proposal-and-Filter (ε = {args.epsilon:g}, δ = 0, β = 0.05)",
                     args.replications, m, ci))
    results["proposal-and-filter"] = {"metrics": {k: vars(v) for k, v in ci.items()},
                                      "interval": [iv.lower, iv.upper], "tau": test.tau}

    print(f"\n## Yelp (first {n} reviews), θ = {args.theta}, similarity ≥ {args.similarity}\n")
    print("\n".join(lines))
    print(f"\nP&F Theorem 5.2 interval [{iv.lower:.3f}, {iv.upper:.3f}] (τ = {test.tau:.4f})")
    for name, items in samples.items():
        print(f"\nsample claims, {name}:")
        for claim, s in items:
            print(f"  f = {s:.3f}  {claim}")
    timings["total_seconds"] = round(time.time() - t_start, 1)
    print(f"\ntimings: {json.dumps(timings)}")
    args.out.write_text(json.dumps({"results": results, "timings": timings}, indent=1,
                                   default=float), encoding="utf-8")


if __name__ == "__main__":
    main()
