"""Can each metric tell real from not-quite-real at the chosen n? (docs/experiments.md)

Before a sweep ranks methods with a metric, this script measures the metric's resolution on
real data. It scores a fixed set **A** of ``n`` held-out real texts (by default rows
[3600, 4100) of Yelp ``dev.csv``, held out by ``experiments/yelp_downstream.toml``: the rows
of the measured runs in docs/experiments.md; ``--real-rows 4000:4500`` gives the held-out
texts of ``experiments/yelp_quality.toml``) against

* **real vs real** (the ceiling): ``n`` other real texts, rows [4100, 4600);
* **deliberately shifted real sets**: the first ``n`` 5-star reviews, the first ``n``
  Restaurants reviews (both from rows outside A and the downstream test rows), and the
  real-vs-real set cut to the generation's T = 64 tokens of the default model (what a
  64-token generation differs in by length alone);
* **generations**: any ``dplang generate`` / ``dplang experiment`` output given with
  ``--generations NAME=PATH`` (e.g. the public-only baseline), first ``n`` in group order.

Metrics (each with a 95 % interval): MAUVE (bootstrap over resampled texts, each resample
with its own k-means seed), the two-sample classifier AUC, the TVD of the label mix
(``label1`` = category, ``label2`` = stars; for generations only the columns they were grouped
by) and downstream accuracy and macro-F1 (train on the case's ``n`` texts, test on rows
[4600, 5000)). The classifier, label and downstream intervals use ``--resamples`` bootstrap
resamples (1,000 by default, as ``dplang evaluate``); MAUVE's use ``--mauve-bootstrap``.
A case is **separated** from real-vs-real when the two intervals do not overlap; a metric that
does not separate a shifted set from real-vs-real at this ``n`` must not rank methods.

Make the public-only generations it needs (no private data; the same prompt, grouping and
held-out rows as the sweep), then run the check::

    # the public cell of the sweep alone (same key, settings and --out as the sweep's, so
    # the sweep later skips it); no ledger charge, no private data read
    dplang experiment experiments/yelp_quality_public.toml --out runs/yelp_quality
    PYTHONPATH=src python experiments/metric_resolution.py \\
        --data ../shared/data/yelp/dev.csv --n 500 --cut-real 64 \\
        --real-rows 4000:4500 --second-rows 4500:5000 --metrics mauve,classifier,labels \\
        --generations public=runs/yelp_quality/cells/public_k50_t1.2_s0/gen.jsonl

Without ``--generations`` only the real cases run (no generation needed). The data file is
read in place; nothing is written unless ``--json PATH`` is given (then mode 600: the numbers
are statistics of the held-out rows).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

LABELS = ("label1", "label2")
FIVE_STARS = "Review Stars: 5.0"
RESTAURANTS = "Business Category: Restaurants"


@dataclass
class TextSet:
    name: str
    texts: list[str]
    labels: dict[str, list[str]] = field(default_factory=dict)
    kind: str = "shifted"  # "ceiling", "shifted" or "generation"


def _range(text: str) -> tuple[int, int]:
    start, stop = (int(x) for x in text.split(":"))
    if not 0 <= start < stop:
        raise argparse.ArgumentTypeError(f"a row range is START:STOP, got {text!r}")
    return start, stop


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def read_rows(path: Path) -> list[tuple[int, str, dict[str, str]]]:
    """(row index, text, labels) of every usable row, in file order (dplang's reader)."""
    from dplang.io import read_records

    return [(r.index, r.text or "", dict(r.labels))
            for r in read_records(path, "text", LABELS, on_unusable="skip")]


def _take(rows: Sequence[tuple[int, str, dict[str, str]]], n: int, name: str,
          keep: Callable[[int, dict[str, str]], bool], kind: str = "shifted") -> TextSet:
    chosen = [(t, lab) for i, t, lab in rows if keep(i, lab)][:n]
    if len(chosen) < n:
        raise SystemExit(f"error: {name}: only {len(chosen)} rows qualify, --n is {n}")
    return TextSet(name, [t for t, _ in chosen],
                   {c: [lab[c] for _, lab in chosen] for c in LABELS}, kind)


def truncate(texts: Sequence[str], tokens: int) -> list[str]:
    """Each text cut to its first ``tokens`` tokens of the default model's tokenizer (the
    generation's T), as ``dplang evaluate --real-max-tokens`` cuts them."""
    from dplang.evaluation.harness import cut_texts
    from dplang.evaluation.lengths import load_tokenizer

    return cut_texts(texts, load_tokenizer("default"), tokens)


def read_generations(spec: str, n: int) -> TextSet:
    from dplang.evaluation.data import load_synthetic
    from dplang.evaluation.twosample import run_labels

    name, _, path = spec.partition("=")
    if not path:
        name, path = Path(spec).parent.name or spec, spec
    run = load_synthetic(path)
    if len(run.texts) < n:
        raise SystemExit(f"error: {path}: {len(run.texts)} generations, --n is {n}")
    run = run.head(n)
    return TextSet(name, run.texts, run_labels(run), "generation")


# ---------------------------------------------------------------------------------- metrics


def _iv(value: float, low: float, high: float) -> dict[str, float]:
    return {"value": value, "low": low, "high": high}


def score(case: TextSet, a: TextSet, feats: Callable[[TextSet], np.ndarray],
          metrics: Sequence[str], args: argparse.Namespace, test: TextSet | None,
          ) -> dict[str, Any]:
    from dplang.evaluation.downstream import fit_and_score
    from dplang.evaluation.mauve_metric import mauve_bootstrap, mauve_from_features
    from dplang.evaluation.twosample import classifier_test, label_mix

    out: dict[str, Any] = {}
    fa, fc = feats(a), feats(case)
    if "mauve" in metrics:
        point = mauve_from_features(fa, fc, num_buckets=args.num_buckets).mauve
        if args.mauve_bootstrap:
            iv = mauve_bootstrap(fa, fc, resamples=args.mauve_bootstrap,
                                 num_buckets=args.num_buckets)
            out["mauve"] = _iv(point, iv.low, iv.high)
        else:
            out["mauve"] = _iv(point, point, point)
    if "classifier" in metrics:
        c = classifier_test(fa, fc, resamples=args.resamples)
        out["classifier"] = _iv(c.auc, c.low, c.high)
    if "labels" in metrics:
        for col in LABELS:
            if col in case.labels:
                mix = label_mix({col: case.labels[col]}, {col: a.labels[col]},
                                resamples=args.resamples)
                out[f"labels:{col}"] = _iv(mix["tvd"], mix["low"], mix["high"])
    if "downstream" in metrics and test is not None:
        ft = feats(test)
        for col in LABELS:
            if col in case.labels:
                s = fit_and_score(fc, case.labels[col], ft, test.labels[col], name=case.name,
                                  role=case.kind, seed=0, resamples=args.resamples)
                out[f"downstream:{col}"] = _iv(s.accuracy, *s.accuracy_ci)
                out[f"macro_f1:{col}"] = _iv(s.macro_f1, *s.macro_f1_ci)
    return out


#: Column header, scale and digits of each metric key in the printed table.
COLUMNS = {
    "mauve": ("MAUVE (%)", 100.0, 2),
    "classifier": ("classifier AUC", 1.0, 3),
    "labels:label1": ("category TVD", 1.0, 3),
    "labels:label2": ("stars TVD", 1.0, 3),
    "downstream:label1": ("downstream acc. category (%)", 100.0, 1),
    "downstream:label2": ("downstream acc. stars (%)", 100.0, 1),
    "macro_f1:label1": ("downstream macro-F1 category (%)", 100.0, 1),
    "macro_f1:label2": ("downstream macro-F1 stars (%)", 100.0, 1),
}


def _fmt(iv: dict[str, float] | None, scale: float, digits: int) -> str:
    if iv is None:
        return "–"
    return (f"{iv['value'] * scale:.{digits}f} [{iv['low'] * scale:.{digits}f}, "
            f"{iv['high'] * scale:.{digits}f}]")


def separated(x: dict[str, float] | None, ceiling: dict[str, float] | None) -> str:
    if x is None or ceiling is None:
        return "–"
    return "yes" if x["low"] > ceiling["high"] or x["high"] < ceiling["low"] else "no"


def render(results: dict[str, dict[str, Any]], kinds: dict[str, str], n: int) -> str:
    keys = [k for k in COLUMNS if any(k in r for r in results.values())]
    lines = [f"Each case against the same n = {n} held-out real texts (A); 95% intervals.", "",
             "| case | " + " | ".join(COLUMNS[k][0] for k in keys) + " |",
             "|---|" + "---|" * len(keys)]
    for name, r in results.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(r.get(k), *COLUMNS[k][1:])
                                                for k in keys) + " |")
    ceiling = next((r for name, r in results.items() if kinds[name] == "ceiling"), None)
    others = [name for name in results if kinds[name] != "ceiling"]
    if ceiling is not None and others:
        lines += ["", "Separated from real vs real (intervals disjoint)?", "",
                  "| metric | " + " | ".join(others) + " |", "|---|" + "---|" * len(others)]
        for k in keys:
            lines.append(f"| {COLUMNS[k][0]} | "
                         + " | ".join(separated(results[o].get(k), ceiling.get(k))
                                      for o in others) + " |")
    return "\n".join(lines)


def batching_mix(config_path: Path, n_real: int) -> str:
    """The label mix each cell of a sweep configuration will have, known before anything is
    generated (grouped batching decides it from positions and public labels): for every B of
    its cells, TVD of the first ``num`` batches' labels against the first ``n_real`` held-out
    rows, in both batch orders."""
    from dplang.evaluation.twosample import label_mix
    from dplang.experiments import load_config
    from dplang.io import Record, read_records
    from dplang.textgen.batching import BATCH_ORDERS, make_batches

    config = load_config(config_path)
    if not config.group_by:
        return f"{config_path}: no group_by, no label mix to predict"
    rows = list(read_records(config.data_path, config.text_column, config.group_by))
    refs = [Record(r.index, None, r.labels) for r in rows
            if config.references[0] <= r.index < config.references[1]]
    real = [r.labels for r in rows if config.real[0] <= r.index < config.real[1]][:n_real]
    cols = list(config.group_by)
    lines = [f"Label mix of the first num = {config.num} batches of {config_path.name}'s "
             f"references against its first {len(real)} held-out rows (TVD [95%]):", "",
             "| order | B | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    sizes = sorted({1 if c.method == "public" else c.batch_size for c in config.cells})
    for order in BATCH_ORDERS:
        for b in sizes:
            batches = make_batches(refs, b, config.num, config.group_by, order=order)
            mix = label_mix({c: [x.labels[c] for x in batches] for c in cols},
                            {c: [lab[c] for lab in real] for c in cols})
            lines.append(f"| {order} | {b} | " + " | ".join(
                f"{mix['columns'][c]['tvd']:.3f} [{mix['columns'][c]['low']:.3f}, "
                f"{mix['columns'][c]['high']:.3f}]" for c in cols) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/yelp/dev.csv"))
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--real-rows", type=_range, default=(3600, 4100),
                        help="rows of A, the held-out set every case is compared with "
                             "(its first n rows are used)")
    parser.add_argument("--second-rows", type=_range, default=(4100, 4600),
                        help="rows of the real-vs-real set (first n used)")
    parser.add_argument("--test-rows", type=_range, default=(4600, 5000),
                        help="downstream test rows (never in any other set)")
    parser.add_argument("--generations", action="append", default=[], metavar="NAME=PATH",
                        help="a dplang generate output to score (repeatable)")
    parser.add_argument("--metrics", default="mauve,classifier,labels,downstream")
    parser.add_argument("--mauve-bootstrap", type=int, default=100, metavar="R",
                        help="MAUVE resamples over texts (0: no interval)")
    parser.add_argument("--resamples", type=int, default=1000, metavar="R",
                        help="bootstrap resamples of the classifier, label and downstream "
                             "intervals")
    parser.add_argument("--num-buckets", type=int, default=None,
                        help="MAUVE buckets (default max(2, n // 20), as dplang evaluate)")
    parser.add_argument("--truncate-tokens", type=int, default=64, metavar="T",
                        help="add the case 'real vs real cut to T tokens' (0: leave it out)")
    parser.add_argument("--cut-real", type=int, default=0, metavar="T",
                        help="cut every real set (A, the cases, the test rows) to its first T "
                             "tokens, as dplang evaluate --real-max-tokens T does (0: whole "
                             "texts)")
    parser.add_argument("--embedder", default="default")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--batching", type=Path, default=None, metavar="CONFIG",
                        help="only print the label mix every cell of this sweep configuration "
                             "will have (from its batching; nothing is embedded or generated)")
    args = parser.parse_args(argv)
    if args.batching is not None:
        print(batching_mix(args.batching, args.n))
        return 0
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    unknown = set(metrics) - {"mauve", "classifier", "labels", "downstream"}
    if unknown:
        parser.error(f"unknown metrics: {', '.join(sorted(unknown))}")
    ranges = {"--real-rows": args.real_rows, "--second-rows": args.second_rows}
    if "downstream" in metrics:
        ranges["--test-rows"] = args.test_rows
    names = list(ranges)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            if _overlap(ranges[x], ranges[y]):
                parser.error(f"{x} and {y} overlap: the sets compared must be disjoint rows")
    started = time.time()
    from dplang.evaluation.embedders import resolve_embedder

    rows = read_rows(args.data)
    n = args.n
    a_lo, a_hi = args.real_rows
    t_lo, t_hi = args.test_rows

    def outside(i: int) -> bool:
        return not (a_lo <= i < a_hi or t_lo <= i < t_hi)

    a = _take(rows, n, "A", lambda i, _l: a_lo <= i < a_hi, "reference")
    cases = [_take(rows, n, "real vs real", lambda i, _l: args.second_rows[0] <= i
                   < args.second_rows[1], "ceiling")]
    cases.append(_take(rows, n, "5-star only", lambda i, lab: outside(i)
                       and lab["label2"] == FIVE_STARS))
    cases.append(_take(rows, n, "Restaurants only", lambda i, lab: outside(i)
                       and lab["label1"] == RESTAURANTS))
    if args.cut_real:
        for s in [a, *cases]:
            s.texts = truncate(s.texts, args.cut_real)
            s.name = s.name if s is a else f"{s.name} (cut to {args.cut_real})"
    elif args.truncate_tokens:
        base = cases[0]
        cases.append(TextSet(f"real vs real cut to {args.truncate_tokens} tokens",
                             truncate(base.texts, args.truncate_tokens), dict(base.labels)))
    cases += [read_generations(spec, n) for spec in args.generations]
    test = (_take(rows, t_hi - t_lo, "test", lambda i, _l: t_lo <= i < t_hi, "test")
            if "downstream" in metrics else None)
    if test is not None and args.cut_real:
        test.texts = truncate(test.texts, args.cut_real)
    embedder = resolve_embedder(args.embedder)
    cache: dict[str, np.ndarray] = {}

    def feats(s: TextSet) -> np.ndarray:
        if s.name not in cache:
            print(f"embedding {len(s.texts)} texts: {s.name}", file=sys.stderr)
            cache[s.name] = embedder.embed(s.texts)
        return cache[s.name]

    results: dict[str, dict[str, Any]] = {}
    timings: dict[str, float] = {}
    for case in cases:
        t0 = time.time()
        print(f"scoring {case.name}", file=sys.stderr)
        results[case.name] = score(case, a, feats, metrics, args, test)
        timings[case.name] = time.time() - t0
    kinds = {c.name: c.kind for c in cases}
    print(render(results, kinds, n))
    elapsed = time.time() - started
    print(f"\nruntime: {elapsed:.0f} s wall clock, {time.process_time():.0f} s CPU "
          f"(embedder {embedder.name}; MAUVE bootstrap {args.mauve_bootstrap} resamples"
          + (f"; every real text cut to {args.cut_real} tokens" if args.cut_real else "") + ")")
    if args.json is not None:
        from dplang.release import write_atomic

        write_atomic(args.json, json.dumps({
            "n": n, "settings": {k: (list(v) if isinstance(v, tuple) else str(v))
                                 for k, v in vars(args).items() if k != "json"},
            "results": results, "kinds": kinds, "seconds": timings, "runtime": elapsed,
        }, indent=2) + "\n", private=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
