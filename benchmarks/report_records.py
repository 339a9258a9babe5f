"""Cost of the report's row-invariant per-record computations, measured side by side.

    .venv/bin/python benchmarks/report_records.py [--records 22 200] [--repeats 2]

On the first ``--records`` rows of ``../shared/data/yelp/dev.csv`` (read in place), chunked as
``dplang report --predicate embedding`` does (one sentence per chunk, 48 words), the script
times, in one process and alternating, the ways to embed the private chunks with the bundled
MiniLM model:

* ``across records``: batches of 32 chunks regardless of record (what a plain
  ``model.encode(chunks)`` does; *not* row-invariant: a chunk's bits depend on other records'
  chunks sharing its batch),
* ``per record``: calls holding one record's chunks only, at most 32 (what dplang does),
* ``per chunk``: one chunk per call (what dplang did before; invariant, slower),

and the two ways to score the chunks against 72 public statements: the float32 product
``statements @ chunks.T`` (*not* row-invariant: its rounding depends on the number of chunks)
and dplang's exact integer cosines (rounding included). It prints the best and the median of
the repeats (the best is the figure to compare when other processes share the cores) and the
ratios to the fastest embedding.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from dplang.reports.predicates import (
    EmbeddingPredicate,
    _record_runs,
    integer_cosines,
    integer_vectors,
    load_default_embedder,
)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "yelp" / "dev.csv"


def read_rows(n: int) -> list[str]:
    rows: list[str] = []
    with DATA.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if len(rows) == n:
                break
            rows.append(row["text"])
    return rows


def alternating(ways: dict[str, Callable[[], object]], repeats: int
                ) -> dict[str, tuple[float, float]]:
    """(best, median) seconds of each way, the ways run in turn ``repeats`` times."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, fn in ways.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: (min(t), statistics.median(t)) for name, t in times.items()}


def bench(pred: EmbeddingPredicate, n: int, statements: list[str], repeats: int) -> None:
    chunks, owner = pred._chunks(read_rows(n))
    runs = _record_runs(owner)
    results = alternating({
        "across records": lambda: pred._encode(chunks, 32),
        "per record": lambda: [pred.record_vectors(chunks[r]) for r in runs],
        "per chunk": lambda: [pred._encode([c], 1) for c in chunks],
    }, repeats)
    fastest = min(best for best, _ in results.values())
    print(f"\n{n} records, {len(chunks)} chunks (embedding)")
    for name, (best, median) in results.items():
        print(f"  {name:15s} best {best:7.2f} s  median {median:7.2f} s  x{best / fastest:.2f}")
    emb = pred._encode(chunks, 32)
    stmt = pred._encode(statements, 32)
    scores = alternating({
        "float32": lambda: stmt @ emb.T,
        "exact": lambda: integer_cosines(integer_vectors(stmt), integer_vectors(emb)),
    }, max(repeats, 5))
    print(f"  similarities: float32 product best {scores['float32'][0] * 1e3:.1f} ms, "
          f"exact integer cosines (rounding included) best {scores['exact'][0] * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="+", default=[22, 200])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not DATA.is_file():
        raise SystemExit(f"{DATA} is missing")
    import torch

    pred = EmbeddingPredicate(0.5, max_words=48)
    load_default_embedder()
    pred._encode(["warm up"], 1)
    statements = [f"The {a} was {q}." for a in ("food", "service", "staff", "price",
                                                "atmosphere", "wait", "location", "room",
                                                "selection", "coffee", "drinks", "parking")
                  for q in ("great", "excellent", "terrible", "disappointing", "fine", "bad")]
    print(f"torch threads: {torch.get_num_threads()}; statements: {len(statements)}")
    for n in args.records:
        bench(pred, n, statements, args.repeats)


if __name__ == "__main__":
    main()
