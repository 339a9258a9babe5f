"""The driver's own memory and start-up under ``dplang generate --executor local``.

    .venv/bin/python benchmarks/driver_footprint.py [--executor local] [--workers 1]
        [-n 2] [-T 4] [--model default] [--repeat 1]

Runs ``dplang generate`` (Yelp references from ``../shared/data/yelp/dev.csv``, B = 4, a
fresh output and ledger in a temporary folder) in a child process that reports, for the
**driver process alone** (``getrusage(RUSAGE_SELF)``, not its workers):

* ``plan_s``: from the start of the command to the end of planning (data read, batches formed,
  prompts rendered, the model, or with a worker executor only its prompt side, loaded);
* ``first_result_s``: from the start to the first group written;
* ``total_s``: the whole command;
* ``driver_max_rss_mib``: the driver's peak resident memory;
* ``workers_max_rss_mib``: the largest peak among the processes it waited for (its workers).

Times include the interpreter's imports (torch, transformers). Where other processes share the
cores, run it more than once (``--repeat``) and read the best.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "yelp" / "dev.csv"

CHILD = r"""
import json, resource, sys, time
t0 = float(sys.argv[1])
import dplang.api.generation as gen_core
from dplang.cli.app import main

marks = {}
real_plan = gen_core.plan_generation

def plan(*a, **k):
    out = real_plan(*a, **k)
    marks["plan_s"] = time.time() - t0
    return out

real_execute = gen_core.execute_plan

def execute(plan, on_result=None, **k):
    def first(record):
        marks.setdefault("first_result_s", time.time() - t0)
        if on_result is not None:
            on_result(record)
    return real_execute(plan, on_result=first, **k)

if __name__ == "__main__":
    gen_core.plan_generation = plan
    gen_core.execute_plan = execute
    code = main(sys.argv[2:])
    marks["total_s"] = time.time() - t0
    marks["exit_code"] = code
    marks["driver_max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    marks["workers_max_rss_mib"] = (
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    print("FOOTPRINT " + json.dumps(marks), file=sys.stderr)
"""


def run_once(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        script = folder / "child.py"
        script.write_text(CHILD)
        argv = ["generate", "--data", str(args.data), "--out", str(folder / "out.jsonl"),
                "--epsilon", "8", "-B", "4", "-T", str(args.max_tokens), "-n", str(args.num),
                "--model", args.model, "--seed", "1", "--quiet",
                "--ledger", str(folder / "ledger.sqlite"),
                "--executor", args.executor, "--workers", str(args.workers)]
        if args.executor == "inline":
            argv = argv[:-4]
        env = {**os.environ, "DPLANG_LEDGER": str(folder / "ledger.sqlite")}
        done = subprocess.run([sys.executable, str(script), repr(time.time()), *argv],
                              capture_output=True, text=True, env=env, timeout=1800)
        for line in done.stderr.splitlines():
            if line.startswith("FOOTPRINT "):
                return json.loads(line.removeprefix("FOOTPRINT "))
        raise SystemExit(f"the run failed ({done.returncode}):\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executor", default="local", choices=["inline", "local", "ray"])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("-n", "--num", type=int, default=2)
    parser.add_argument("-T", "--max-tokens", type=int, default=4)
    parser.add_argument("--model", default="default")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    for _ in range(args.repeat):
        marks = run_once(args)
        print(json.dumps({"executor": args.executor, "workers": args.workers,
                          "load_avg_1m_before": round(load, 2),
                          **{k: round(v, 2) if isinstance(v, float) else v
                             for k, v in marks.items()}}))
        load = os.getloadavg()[0]


if __name__ == "__main__":
    main()
