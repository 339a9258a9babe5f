"""Paper 000 (the price of privacy): every experiment of dplang.formal at full size.

    .venv/bin/python benchmarks/formal_statistical.py [--img docs/img] [--workers 2] [--quick]
        [--only price:thm4.5 ...]

Runs price:thm3.2 … price:dfa (000 E1–E10), prints each experiment's markdown table and its
runtime, and writes docs/img/formal_price_*.png (the command and runtimes are quoted in
docs/formal.md). Exact evaluations unless a table says Monte Carlo / Rao–Blackwell.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from dplang.formal.experiments import EXPERIMENTS, run_experiment, slug, write_result

PREFIX = "price:"


def main(prefix: str = PREFIX) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img", type=Path, default=Path("docs/img"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    names = [n for n in EXPERIMENTS if n.startswith(prefix)]
    if args.only:
        names = [n for n in names if n in args.only]
    total = time.perf_counter()
    for name in names:
        res = run_experiment(name, quick=args.quick, seed=args.seed, workers=args.workers)
        with tempfile.TemporaryDirectory() as tmp:
            image = args.img / f"formal_{slug(name)}.png" if res.plot is not None else None
            write_result(res, Path(tmp), image=image)
        print(f"\n## {name} — {res.title}\n")
        print(res.table)
        print(f"\n({res.runtime_s:.1f} s with {args.workers} worker(s)"
              + (f"; figure {image}" if image else "") + ")")
    print(f"\ntotal {time.perf_counter() - total:.0f} s")


if __name__ == "__main__":
    main()
