"""How long a process takes to load the default model, this checkout's code against an earlier
commit's, side by side in one run.

    .venv/bin/python benchmarks/load_time.py --against 1aeaf33 [--rounds 5] [--dtype bfloat16]

Every measurement is a new Python process (each commit's ``src/`` extracted with ``git
archive`` and put first on ``PYTHONPATH``, as ``benchmarks/row_invariance.py`` does) that
imports dplang and calls ``load_default_model``: what a user waits for before the first token
of every ``dplang generate``. The two alternate; the first round of each is printed apart (it
may write the load-time records its code keys: the row-invariance check, the kernels'
admission probes, the tokenizer's comparison) and the later rounds give the median and best.
Printed: seconds from the interpreter's start to the loaded model, of which the load call,
and the ratio current / earlier.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from row_invariance import extract

WORKER = """
import json, sys, time
start = time.perf_counter()
from dplang.models import load_default_model
model = load_default_model(dtype=sys.argv[1])
print(json.dumps({"load_s": time.perf_counter() - start}))
"""


def measure(src: Path, dtype: str) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    begin = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", WORKER, dtype], check=False,
                         capture_output=True, text=True, env=env)
    wall = time.perf_counter() - begin
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"the load with {src} failed (exit {out.returncode}):\n{tail}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="earlier commit to compare with")
    ap.add_argument("--current", default="HEAD", help="the commit measured as 'current'")
    ap.add_argument("--rounds", type=int, default=5, help="rounds after the first")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"current": [], args.against: []}
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"current": extract(args.current, Path(tmp) / "current"),
                   args.against: extract(args.against, Path(tmp) / "earlier")}
        for r in range(args.rounds + 1):
            for name, src in sources.items():
                result = measure(src, args.dtype)
                runs[name].append(result)
                print(f"round {r} {name:>10}: process {result['wall_s']:.2f} s, load call "
                      f"{result['load_s']:.2f} s" + (" (first: may write records)" if r == 0
                                                    else ""), flush=True)
    print(f"\ndefault model, {args.dtype}; rounds 1..{args.rounds} (round 0 apart)")
    print(f"{'code':>12} {'round 0':>8} {'median':>8} {'best':>8}  (process wall, s)")
    medians = {}
    for name, results in runs.items():
        walls = [r["wall_s"] for r in results[1:]]
        medians[name] = statistics.median(walls)
        print(f"{name:>12} {results[0]['wall_s']:>8.2f} {medians[name]:>8.2f} "
              f"{min(walls):>8.2f}")
    print(f"time current / {args.against}: {medians['current'] / medians[args.against]:.2f}x "
          "(medians)")


if __name__ == "__main__":
    main()
