"""How much of a MAUVE difference between two cells of a sweep is noise?

For a finished ``dplang experiment`` directory, recompute every cell's MAUVE over several
k-means seeds (same embeddings, same n, same buckets as the sweep), and score two reference
points: held-out real texts against other held-out real texts ("real vs real", the ceiling at
this n) and the public-only cell. Prints a markdown table (mean and standard deviation over
seeds). Reads only the experiment directory; spends no privacy budget (the generations exist).

    .venv/bin/python experiments/mauve_spread.py runs/yelp_compute --n 50 --buckets 5
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from dplang.evaluation.data import load_synthetic
from dplang.evaluation.embedders import resolve_embedder
from dplang.evaluation.mauve_metric import mauve_from_features
from dplang.io import iter_json_objects


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", type=Path, help="directory written by dplang experiment")
    ap.add_argument("--n", type=int, default=50, help="texts per side")
    ap.add_argument("--buckets", type=int, default=5, help="MAUVE k-means buckets")
    ap.add_argument("--seeds", type=int, default=5, help="k-means seeds 0..seeds-1")
    args = ap.parse_args()

    real_rows = [obj["text"] for _, obj in iter_json_objects(args.experiment / "data" /
                                                             "real.jsonl")]
    if len(real_rows) < 2 * args.n:
        raise SystemExit(f"need {2 * args.n} held-out texts for real vs real, "
                         f"have {len(real_rows)}")
    embedder = resolve_embedder("default")
    real = embedder.embed(real_rows[: args.n])
    sets = {"real vs real (held-out rows n..2n)": embedder.embed(real_rows[args.n: 2 * args.n])}
    for cell in sorted((args.experiment / "cells").iterdir()):
        gen = cell / "gen.jsonl"
        if (cell / "eval" / "metrics.json").exists() and gen.exists():
            sets[cell.name] = embedder.embed(load_synthetic(gen).texts[: args.n])

    print(f"| cell | MAUVE (%) mean | sd over {args.seeds} k-means seeds |")
    print("|---|---|---|")
    for name, feats in sets.items():
        scores = [100 * mauve_from_features(real, feats, num_buckets=args.buckets,
                                            seed=s).mauve for s in range(args.seeds)]
        print(f"| {name} | {statistics.mean(scores):.2f} | {statistics.stdev(scores):.2f} |")


if __name__ == "__main__":
    main()
