"""Throughput of InvisibleInk generation with the default model, measured side by side.

    .venv/bin/python benchmarks/generation_throughput.py [--tokens 64] [--data PATH]
                                                         [--dtype float32|bfloat16]
                                                         [--repeats 3]

References come from ``../shared/data/yelp/dev.csv`` (B = 7, k = 50, τ = 1.2, ε = 10,
δ = 1e-6). Every timed decode runs exactly T steps (EOS ignored) so that step costs compare
like with like. The script prints, in one run:

1. DP tokens/s at G ∈ {1, 4, 8} concurrent groups (sparse LM head) and the G=8 / G=1 ratio;
2. the dense DP step against a plain (non-private) decode step over the same G×(B+1) rows;
3. the sparse LM head against the dense path at G = 1;
4. DP generation against non-private generation of the same number of texts at equal batch
   capacity (G×(B+1) = 64 rows): the cost multiple per text, for two kinds of non-private
   generation: (a) each text conditioned on one reference (the same private prompts, no DP:
   what the task costs without privacy) and (b) each text from the public prompt alone.
"""

from __future__ import annotations

import argparse
import statistics
import time
from itertools import pairwise
from pathlib import Path

import torch

from dplang.io import load_references
from dplang.models import load_default_model
from dplang.privacy import RandomStreams, epsilon_to_rho
from dplang.textgen.engine import DecodingParams, GroupJob, run_plain
from dplang.textgen.methods.invisibleink import calibrate_clip, run_invisibleink
from dplang.textgen.prompts import get_template

B, K, TAU, EPS, DELTA = 7, 50, 1.2, 10.0, 1e-6
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "yelp" / "dev.csv"


def make_jobs(model, n_groups: int, data: Path, max_ref_tokens: int = 256) -> list[GroupJob]:
    records, _ = load_references(data, "text", ("label1", "label2"), limit=n_groups * B)
    template = get_template("yelp", chat=model.has_chat_template)
    jobs = []
    for g in range(n_groups):
        chunk = records[g * B:(g + 1) * B]
        labels = chunk[0].labels
        public = model.render_prompt(template.render(None, labels), template.system)
        private = tuple(
            model.render_prompt(
                template.render(model.truncate_tokens(r.text or "", max_ref_tokens), labels),
                template.system,
            )
            for r in chunk
        )
        jobs.append(GroupJob(g, public, private))
    return jobs


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


class StepClock:
    """Time stamps of the decode steps; :meth:`step_ms` is the median of the steady-state
    steps after the first (the first step includes the prompts' prefill), which a passing
    hiccup of the VM does not move."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, _n: int) -> None:
        self.stamps.append(time.perf_counter())

    def step_ms(self) -> float:
        s = self.stamps
        return statistics.median(b - a for a, b in pairwise(s)) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds of all measurements; each keeps its best")
    args = ap.parse_args()
    T = args.tokens
    torch.manual_seed(0)
    model, load_s = timed(lambda: load_default_model(dtype=args.dtype))
    clip = calibrate_clip(epsilon_to_rho(EPS, DELTA), T, B, TAU)
    print(f"default model {model.model_id} loaded in {load_s:.1f} s; threads="
          f"{torch.get_num_threads()}; dtype={args.dtype}; B={B} k={K} tau={TAU} eps={EPS} "
          f"T={T} C={clip:.4f}; best of {args.repeats} rounds of all measurements")
    all_jobs = make_jobs(model, 10, args.data)  # 8 groups for DP; 64 private prompts for (a)
    jobs = all_jobs[:8]
    streams = RandomStreams(0)

    def dp(groups: int, sparse: bool) -> tuple[float, float]:
        params = DecodingParams(clip, B, TAU, K, T, sparse_head=sparse, stop_at_eos=False)
        clock = StepClock()
        _, secs = timed(lambda: run_invisibleink(model, jobs[:groups], params, streams,
                                                 concurrent_groups=groups, on_step=clock))
        return secs, clock.step_ms()

    def plain(prompts: list[str]) -> tuple[float, float]:
        clock = StepClock()
        _, secs = timed(lambda: run_plain(model, prompts, T, TAU, K, streams,
                                          stop_at_eos=False, on_step=clock))
        return secs, clock.step_ms()

    # Non-private generation of the same number of texts at equal batch capacity: the
    # G×(B+1) = 64 rows hold 64 texts instead of 8 private groups.
    same_rows = [p for j in jobs for p in (*j.private_prompts, j.public_prompt)]
    conditioned = [p for j in all_jobs for p in j.private_prompts][: len(same_rows)]
    public_prompts = [jobs[i % 8].public_prompt for i in range(len(same_rows))]
    runs = {
        "sparse 1": lambda: dp(1, True),
        "sparse 4": lambda: dp(4, True),
        "sparse 8": lambda: dp(8, True),
        "dense 1": lambda: dp(1, False),
        "dense 8": lambda: dp(8, False),
        "plain 8": lambda: plain(same_rows),
        "(a) one reference per text": lambda: plain(conditioned),
        "(b) public prompt only": lambda: plain(public_prompts),
    }
    dp(1, True)  # warm-up (allocator, thread pools)
    # Rounds of every measurement in turn, so that the VM's slow speed drifts hit all of them
    # alike; each keeps its best (end-to-end s, decode step ms) over the rounds.
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            samples[name].append(run())
    best = {name: (min(s[0] for s in got), min(s[1] for s in got))
            for name, got in samples.items()}

    rows = {}
    print("end-to-end = prefill of the prompts + T decode steps; step = median steady-state "
          "decode step")
    for g in (1, 4, 8):
        secs, step = rows[g] = best[f"sparse {g}"]
        print(f"DP sparse  G={g}: {g * T / secs:7.2f} tokens/s end-to-end "
              f"({g * (B + 1)} rows); decode step {step:6.1f} ms "
              f"({g * 1000 / step:6.2f} tokens/s)")
    e2e = (8 * T / rows[8][0]) / (T / rows[1][0])
    dec = (8 / rows[8][1]) / (1 / rows[1][1])
    print(f"throughput G=8 / G=1: {e2e:.2f}x end-to-end, {dec:.2f}x decode steps "
          "(target >= 3x)")

    dense1 = best["dense 1"]
    print(f"DP dense   G=1: {T / dense1[0]:7.2f} tokens/s end-to-end; decode step "
          f"{dense1[1]:6.1f} ms")
    print(f"sparse LM head speed-up at G=1: {dense1[0] / rows[1][0]:.2f}x end-to-end, "
          f"{dense1[1] / rows[1][1]:.2f}x decode step  (target >= 1.5x)")

    dense8, plain8 = best["dense 8"], best["plain 8"]
    print(f"DP dense   G=8: decode step {dense8[1]:6.1f} ms; plain decode of the same "
          f"{len(same_rows)} rows: {plain8[1]:6.1f} ms")
    print(f"dense DP step / plain step over the same rows: {dense8[1] / plain8[1]:.3f} "
          f"(end-to-end {dense8[0] / plain8[0]:.3f})  (target <= 1.10)")

    per_text_dp, step_dp = rows[8][0] / 8, rows[8][1] / 8
    for name, prompts in (("(a) one reference per text", conditioned),
                          ("(b) public prompt only", public_prompts)):
        np_secs, np_step = best[name]
        per_text_np = np_secs / len(prompts)
        print(f"non-private {name}: {len(prompts)} texts in {np_secs:.1f} s "
              f"({per_text_np:.2f} s/text, decode step {np_step:.1f} ms); DP (sparse, G=8): "
              f"{per_text_dp:.2f} s/text")
        print(f"  DP cost multiple: {per_text_dp / per_text_np:.2f}x end-to-end, "
              f"{step_dp / (np_step / len(prompts)):.2f}x decode steps "
              "(target <= 5x; the paper reports 8x-10x)")


if __name__ == "__main__":
    main()
