"""How long a process takes to load the default model, this checkout's code against an earlier
commit's, side by side in one run.

    .venv/bin/python benchmarks/load_time.py --against 1aeaf33 [--rounds 5] [--dtype bfloat16]
                                             [--demo]

Every measurement is a new Python process (each commit's ``src/`` extracted with ``git
archive`` and put first on ``PYTHONPATH``, as ``benchmarks/row_invariance.py`` does) that
imports dplang and calls ``load_default_model``: what a user waits for before the first token
of every ``dplang generate``. The two alternate; the first round of each is printed apart (it
may write the load-time records its code keys: the row-invariance check, the kernels'
admission probes, the tokenizer's comparison) and the later rounds give the median and best.
Printed: seconds from the interpreter's start to the loaded model, of which the load call,
and the ratio current / earlier. With ``--demo`` each process runs the whole ``make demo``
generation instead (``dplang generate`` on the shipped demo corpus, the demo's flags, a new
output folder each time, and ``--dataset load-time-demo``: the noise depends on the dataset's
name, by default the data file's resolved path, which differs between the extracted copies):
what a user waits for, start to end, and the sha256 of the texts written (the same bytes are
expected from both commits when the arithmetic did not change).
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


DEMO_WORKER = """
import hashlib, json, sys, tempfile, time
from pathlib import Path
start = time.perf_counter()
from importlib.resources import files
from dplang.cli.app import main
from dplang.io import demo_corpus_path
out = Path(tempfile.mkdtemp()) / "demo.jsonl"
template = Path(str(files("dplang") / "data" / "demo_template.toml"))
code = main(["generate", "--data", str(demo_corpus_path()), "--model", "default",
             "--epsilon", "10", "--delta", "1e-6", "--batch-size", "7", "--max-tokens", "64",
             "--temperature", "1.0", "--top-k", "50", "--prompt", str(template),
             "--seed", "2026", "--out", str(out), "--ledger", str(out.parent / "l.sqlite"),
             "--dtype", sys.argv[1], "--dataset", "load-time-demo", "--quiet"])
assert code == 0, code
print(json.dumps({"load_s": time.perf_counter() - start,
                  "texts": hashlib.sha256(out.read_bytes()).hexdigest()}))
"""


def measure(src: Path, dtype: str, demo: bool = False) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    begin = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", DEMO_WORKER if demo else WORKER, dtype],
                         check=False, capture_output=True, text=True, env=env)
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
    ap.add_argument("--demo", action="store_true",
                    help="run the demo's whole generation in each process, not only the load")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"current": [], args.against: []}
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"current": extract(args.current, Path(tmp) / "current"),
                   args.against: extract(args.against, Path(tmp) / "earlier")}
        for r in range(args.rounds + 1):
            for name, src in sources.items():
                result = measure(src, args.dtype, args.demo)
                runs[name].append(result)
                what = "in Python" if args.demo else "load call"
                print(f"round {r} {name:>10}: process {result['wall_s']:.2f} s, {what} "
                      f"{result['load_s']:.2f} s" + (" (first: may write records)" if r == 0
                                                    else ""), flush=True)
    job = "the demo's generation (6 texts, T = 64)" if args.demo else "the load"
    print(f"\ndefault model, {args.dtype}, {job}; rounds 1..{args.rounds} (round 0 apart)")
    if args.demo:
        digests = {r["texts"] for results in runs.values() for r in results}
        print("texts: the same bytes in every run" if len(digests) == 1
              else f"texts: {len(digests)} different outputs")
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
