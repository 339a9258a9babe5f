"""Canaries through the whole pipeline: what InvisibleInk emits of a phrase in m references.

    PYTHONPATH=src .venv/bin/python benchmarks/canaries.py [--num 32] [-B 3] [-T 32]
        [--epsilons 1,10] [--repeats 1,2,5,20,50] [--data ../shared/data/yelp/dev.csv]
        [--model default] [--out DIR]

A thin wrapper over :func:`dplang.experiments.canary_run.run_canaries`, the library function
behind ``dplang evaluate canaries`` (docs/evaluation.md, "Canaries"): the first ``num × B``
rows of ``--data`` are generated with and without canary sentences, for every ε, through the
release pipeline with a throw-away ledger in a temporary mode-700 folder (removed at the end),
with one fresh secret seed for all runs. Prints the table; ``--out DIR`` (optional) receives
``canaries.json``, ``canaries.md`` and ``canaries.png``, mode 600 (they describe generations
from the references).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from dplang.experiments.canary_run import (
    CanaryRunSettings,
    render_canaries,
    run_canaries,
    write_canary_outputs,
)

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "yelp" / "dev.csv"


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run, print the table (and write ``--out``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--num", type=int, default=32, help="generations per run")
    p.add_argument("-B", "--batch-size", type=int, default=3)
    p.add_argument("-T", "--max-tokens", type=int, default=32)
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--temperature", type=float, default=1.2)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--epsilons", default="1,10")
    p.add_argument("--repeats", default="1,2,5,20,50")
    p.add_argument("--model", default="default")
    p.add_argument("--canary-seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    settings = CanaryRunSettings(
        data=args.data, epsilons=tuple(float(x) for x in args.epsilons.split(",")),
        repeats=tuple(int(x) for x in args.repeats.split(",")), num=args.num,
        batch_size=args.batch_size, max_tokens=args.max_tokens, top_k=args.top_k,
        temperature=args.temperature, delta=args.delta, model=args.model,
        canary_seed=args.canary_seed)
    # SIGTERM as an exception, so that the temporary copies of the data are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run_canaries(settings, progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(render_canaries(result))
    if args.out is not None:
        write_canary_outputs(result, args.out)


if __name__ == "__main__":
    main()
