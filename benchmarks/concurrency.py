"""Texts per second and peak memory at several ``--concurrent-groups``, side by side.

    .venv/bin/python benchmarks/concurrency.py [--groups 8,16,32] [--texts 32] [--tokens 64]

Each G runs in its own process (its own peak resident memory) on the same Yelp jobs as
``benchmarks/row_invariance.py`` (B = 7, k = 50, τ = 1.2, ε = 10, EOS honoured, bfloat16, the
default model), the same seed: the texts are the same bytes at every G; only speed and memory
change. Prints seconds per text, DP tokens/s, peak RSS and the speed against the first G.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(groups: int, texts: int, tokens: int) -> dict:
    sys.path.insert(0, str(HERE))
    from dplang.models import load_default_model
    from dplang.privacy import RandomStreams, epsilon_to_rho
    from dplang.textgen.engine import DecodingParams
    from dplang.textgen.methods.invisibleink import calibrate_clip, run_invisibleink
    from row_invariance import B, yelp_jobs

    model = load_default_model(dtype="bfloat16")
    jobs = yelp_jobs(model, texts, "completion")
    clip = calibrate_clip(epsilon_to_rho(10.0, 1e-6), tokens, B, 1.2)
    params = DecodingParams(clip, B, 1.2, 50, tokens, sparse_head=True, stop_at_eos=True)
    start = time.perf_counter()
    results = run_invisibleink(model, jobs, params, RandomStreams(0), concurrent_groups=groups)
    seconds = time.perf_counter() - start
    return {"G": groups, "seconds": seconds, "tokens": sum(r.num_tokens for r in results),
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="8,16,32")
    ap.add_argument("--texts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.texts, args.tokens)))
        return
    rows = []
    for g in (int(x) for x in args.groups.split(",")):
        done = subprocess.run([sys.executable, __file__, "--worker", str(g), "--texts",
                               str(args.texts), "--tokens", str(args.tokens)],
                              capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"G = {g}: done", flush=True)
    print(f"\n{args.texts} texts, up to {args.tokens} tokens, B = 7, bfloat16")
    print(f"{'G':>4} {'s / text':>9} {'DP tok/s':>9} {'peak MiB':>9} {'speed':>6}")
    for r in rows:
        print(f"{r['G']:>4} {r['seconds'] / args.texts:>9.2f} {r['tokens'] / r['seconds']:>9.1f} "
              f"{r['peak_mib']:>9.0f} {rows[0]['seconds'] / r['seconds']:>5.2f}x")


if __name__ == "__main__":
    main()
