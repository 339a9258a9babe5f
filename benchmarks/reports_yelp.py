"""Yelp demonstration: proposal-and-filter against free-text DP generation (paper Table 1 layout).

Corpus R: the first ``--records`` rows (default 1000) of ``shared/data/yelp/dev.csv`` (a rule on
positions only). Support predicate for *every* method: the embedding predicate (bundled
all-MiniLM-L6-v2; σ_s(r) = 1 iff some sentence of review r has cosine similarity ≥
``--similarity`` with s; one sentence per chunk), fixed before the data is read.

Methods (all private ones at ε = 10):

* **Proposal-and-Filter** — a tag-template schema over business types, aspects and sentiment
  (written below, before looking at the data); exact discrete-Laplace support tests, β = 0.05,
  threshold θ. One release (seed 0) plus ``--replications`` re-draws of the noise on the same
  exact counts for EmitRate / UnsupportedEmit / FalseEmission averages and the Theorem 5.2 check.
* **InvisibleInk** (free-text DP, ε = 10, δ = 1e-5) through dplang's public generation API
  (``plan_generation`` / ``execute_plan``, default model Gemma 3 270M, B = 7, T = 64): one
  generation per (category, stars) group, from the first 7 reviews of R in each of the first
  ``--groups`` groups (order of first appearance) that have at least 7 (a rule on public labels
  and positions only).
* **Unfiltered LLM** (no data, ε = 0): the same model continues the same groups' *public*
  prompts (``dplang.textgen.engine.run_plain``).

Free-text outputs are parsed into claims (the text is cut where the base model starts a new
"Here is a/another ..." header; then sentences of ≥ 3 words ending in ., ! or ?; a text without
such a sentence counts as one claim if it has ≥ 3 words) and each claim is scored with
the same predicate. FalseEmission = fraction of emitted statements / parsed claims with support
< θ; MeanSupport = their mean support.

Run::

    .venv/bin/python benchmarks/reports_yelp.py --records 1000 --seed 0

Evaluation only: the printed supports are exact statistics of R (a public benchmark corpus).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from dplang.io import load_references
from dplang.privacy.randomness import RandomStreams
from dplang.release import OutputPaths
from dplang.reports.evaluation import (
    emit_rate,
    exact_expected_emit_rate,
    false_emission,
    mean_support,
    theorem_5_2_interval,
    unsupported_emit,
)
from dplang.reports.mechanism import FilterConfig, certify_counts, proposal_and_filter
from dplang.reports.predicates import EmbeddingPredicate, support_counts
from dplang.reports.proposers import SlotValue, TemplateProposer
from dplang.reports.statements import Statement

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "yelp" / "dev.csv"

#: The public tag-template schema (fixed before the data is read).
SCHEMA = TemplateProposer(
    ["The {aspect} was {quality}.", "This {business} is {verdict}."],
    {
        "aspect": [SlotValue(a) for a in ("food", "service", "staff", "price", "atmosphere",
                                          "wait", "location", "room", "selection", "coffee",
                                          "drinks", "parking")],
        "quality": [SlotValue(q) for q in ("great", "excellent", "terrible", "disappointing")],
        "business": [SlotValue(b) for b in ("restaurant", "bar", "hotel", "salon", "shop",
                                            "spa", "doctor's office", "museum",
                                            "event venue", "grocery store")],
        "verdict": [SlotValue(v) for v in ("highly recommended", "not worth it")],
    },
)

_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_ECHO = re.compile(r"\bHere is (a|another)\b")


def parse_claims(text: str) -> list[str]:
    """Sentence claims of a generated text (see the module docstring). The text is first cut
    where the base model starts a new prompt-like header ("Here is a/another ...")."""
    echo = _ECHO.search(text)
    if echo:
        text = text[: echo.start()]
    pieces = [" ".join(p.split()).lstrip("-*• ").strip() for p in _SPLIT.split(text)]
    claims = [p for p in pieces
              if p.endswith((".", "!", "?")) and len(p.split()) >= 3 and len(p) <= 300]
    if not claims and len(text.split()) >= 3:
        claims = [" ".join(text.split())[:300]]
    return claims


def run_free_text(records, work: Path, args, model) -> tuple[list[str], list[str], dict]:
    """InvisibleInk texts and unfiltered (public-prompt) texts for the same groups."""
    from dplang.textgen.engine import run_plain
    from dplang.textgen.orchestration import GenerationRequest, execute_plan, plan_generation
    from dplang.textgen.prompts import get_template

    groups: dict[tuple[str, str], list] = defaultdict(list)
    for r in records:
        if r.text is not None:
            groups[(r.labels["label1"], r.labels["label2"])].append(r)
    chosen = [(k, v[: args.batch_size]) for k, v in groups.items()
              if len(v) >= args.batch_size][: args.groups]
    subset = work / "invisibleink_refs.csv"
    with open(subset, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label1", "label2"])
        for (l1, l2), recs in chosen:
            for r in recs:
                w.writerow([r.text, l1, l2])
    out = work / "invisibleink.jsonl"
    OutputPaths.of(out).remove()  # a stale run: its output, manifest and side file
    req = GenerationRequest(
        data=subset, out=out, batch_size=args.batch_size, max_tokens=args.max_tokens,
        temperature=1.2, top_k=50, epsilon=args.epsilon, delta=1e-5, seed=args.seed,
        prompt="yelp", group_by=("label1", "label2"), model="default",
        ledger=work / "ledger.sqlite", concurrent_groups=8,
    )
    t0 = time.time()
    plan = plan_generation(req, lambda spec: model)
    summary = execute_plan(plan)
    ink = [json.loads(line)["text"] for line in out.read_text(encoding="utf-8").splitlines()]
    t_ink = time.time() - t0

    template = get_template("yelp", chat=model.has_chat_template)
    prompts = [model.render_prompt(template.render(None, {"label1": l1, "label2": l2}),
                                   template.system) for (l1, l2), _ in chosen]
    t0 = time.time()
    ids = run_plain(model, prompts, args.max_tokens, 1.2, 50, RandomStreams(args.seed + 1))
    plain = [model.decode(x) for x in ids]
    info = {"groups": len(chosen), "invisibleink_seconds": round(t_ink, 1),
            "unfiltered_seconds": round(time.time() - t0, 1),
            "invisibleink_guarantee": plan.guarantee.summary(),
            "invisibleink_epsilon": summary.guarantee.epsilon,
            "invisibleink_clip": plan.params.clip}
    return ink, plain, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--beta", type=float, default=0.05)
    parser.add_argument("--theta", type=float, default=0.05)
    parser.add_argument("--similarity", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--groups", type=int, default=16,
                        help="generations: the first GROUPS (category, stars) groups with at "
                             "least B reviews, in order of first appearance")
    parser.add_argument("--replications", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/dplang_reports_yelp"))
    parser.add_argument("--skip-generation", action="store_true",
                        help="only proposal-and-filter (no language model)")
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    # ---- public choices, fixed before the data is read
    statements = SCHEMA.propose()
    predicate = EmbeddingPredicate(args.similarity, max_words=48, pack=False)
    config = FilterConfig(epsilon=args.epsilon, beta=args.beta, theta=args.theta,
                          noise="discrete-laplace")

    # ---- the corpus
    records, _ = load_references(DATA, "text", ("label1", "label2"), limit=args.records)
    texts = [r.text for r in records]
    n, m = len(texts), len(statements)
    print(f"corpus: first {n} rows of {DATA.name}; {m} candidate statements; "
          f"predicate {predicate.id}")

    # ---- proposal-and-filter: one release, then noise replications (evaluation)
    t0 = time.time()
    report = proposal_and_filter(statements, texts, predicate, config, seed=args.seed)
    t_embed = time.time() - t0
    counts = support_counts(predicate, statements, texts)  # exact (evaluation only)
    f = counts / n
    masks = [report.emitted_mask]
    for rep in range(1, args.replications):
        masks.append(certify_counts(statements, counts, n, config,
                                    RandomStreams(args.seed + 1000 + rep)).emitted_mask)
    emitted = np.array(masks)
    test = report.test
    iv = theorem_5_2_interval(f, config.theta, test.tau, test.beta)
    pf = {
        "m": m, "tau": test.tau, "epsilon0": test.epsilon,
        "release_emitted": int(report.emitted_mask.sum()),
        "release_false_emission": false_emission(report.emitted_mask, f, config.theta),
        "release_mean_support": mean_support(report.emitted_mask, f),
        "false_emission": false_emission(emitted, f, config.theta),
        "mean_support": mean_support(emitted, f),
        "emit_rate": emit_rate(emitted),
        "emit_rate_ci": 1.96 * emitted.mean(axis=1).std(ddof=1) / math.sqrt(len(emitted)),
        "exact_emit_rate": exact_expected_emit_rate(counts, test, config.theta),
        "unsupported_emit": unsupported_emit(emitted, f, config.theta),
        "interval": [iv.lower, iv.upper], "p_theta": iv.p_theta,
        "p_theta_2tau": iv.p_theta_2tau, "embed_seconds": round(t_embed, 1),
        "mean_support_all_candidates": float(f.mean()),
    }
    print(f"\nProposal-and-filter release (seed {args.seed}):")
    for c in sorted(report.emitted, key=lambda c: -(c.lower_bound or 0)):
        print(f"  EMIT L ≥ {c.lower_bound:.3f}  (true f = {f[c.index]:.3f})  {c.statement}")
    print(f"  ... {len(report.abstained)} abstentions")

    rows = []
    info: dict = {}
    samples: dict[str, list[tuple[str, float]]] = {}
    if not args.skip_generation:
        from dplang.models import resolve_model

        t0 = time.time()
        model = resolve_model("default")
        info["model_load_seconds"] = round(time.time() - t0, 1)
        ink, plain, gen_info = run_free_text(records, args.work_dir, args, model)
        info.update(gen_info)
        for name, texts_out in (("Unfiltered LLM (ε = 0)", plain),
                                ("InvisibleInk (ε = 10, δ = 1e-5)", ink)):
            claims = [c for t in texts_out for c in parse_claims(t)]
            cf = (support_counts(predicate, [Statement(c) for c in claims], texts) / n
                  if claims else np.zeros(0))
            ones = np.ones(len(claims), dtype=bool)
            rows.append((name, len(texts_out), len(claims),
                         false_emission(ones, cf, config.theta) if claims else math.nan,
                         mean_support(ones, cf) if claims else math.nan))
            samples[name] = list(zip(claims[:8], cf[:8].tolist(), strict=True))
            (args.work_dir / f"{name.split()[0].lower()}_texts.json").write_text(
                json.dumps(texts_out, indent=1, ensure_ascii=False), encoding="utf-8")
    rows.append(("Proposal-and-Filter (ε = 10, β = 0.05)", args.replications, m,
                 pf["false_emission"], pf["mean_support"]))

    print(f"\n## Yelp (first {n} reviews), θ = {config.theta}, similarity ≥ "
          f"{args.similarity}\n")
    print("| Method | texts / runs | claims / candidates | FalseEmit ↓ | MeanSupport ↑ |")
    print("|---|---|---|---|---|")
    for name, a, b, fe, ms in rows:
        print(f"| {name} | {a} | {b} | {fe:.3f} | {ms:.3f} |")
    print(f"\nProposal-and-filter, single release (seed {args.seed}): "
          f"{pf['release_emitted']} of {m} emitted, FalseEmission "
          f"{pf['release_false_emission']:.3f}, MeanSupport {pf['release_mean_support']:.3f}")
    print(f"Theorem checks over {args.replications} noise draws: UnsupportedEmit "
          f"{pf['unsupported_emit']:.4f} (β = {config.beta}); EmitRate {pf['emit_rate']:.3f} "
          f"± {pf['emit_rate_ci']:.3f} (exact {pf['exact_emit_rate']:.3f}) in "
          f"[{iv.lower:.3f}, {iv.upper:.3f}] (p_θ = {iv.p_theta:.3f}, p_θ+2τ = "
          f"{iv.p_theta_2tau:.3f}, τ = {test.tau:.4f}, ε₀ = {test.epsilon:.4f}); "
          f"mean support over all candidates {pf['mean_support_all_candidates']:.3f}")
    for name, items in samples.items():
        print(f"\nsample claims, {name}:")
        for claim, sup in items:
            print(f"  f = {sup:.3f}  {claim}")
    info["total_seconds"] = round(time.time() - t_start, 1)
    print(f"\ntimings: {json.dumps({**info, 'embed_seconds': pf['embed_seconds']})}")
    (args.work_dir / "results.json").write_text(json.dumps(
        {"proposal_and_filter": pf, "table": rows, "info": info}, indent=1, default=float),
        encoding="utf-8")


if __name__ == "__main__":
    main()
