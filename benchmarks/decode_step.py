"""Where a DP decode step's time goes, and its peak memory (default model, G groups of B = 7).

    .venv/bin/python benchmarks/decode_step.py [--groups 8] [--tokens 32] [--dtype float32]

Runs InvisibleInk (k = 50, τ = 1.2, ε = 10) on G groups of Yelp references with EOS ignored,
times every integer matrix product (:func:`dplang.models.exact.exact_products` and
:func:`~dplang.models.exact.packed_products`), the attention
kernel and the whole decode steps (after the first), and prints the step's time against its
own matrix products (the target: a step within 1.5x of its products), the prefill
time and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import itertools
import resource
import statistics
import time
from collections import defaultdict

import torch

from dplang.models import cpu_kernels, exact
from dplang.models.default import load_default_model
from dplang.privacy import RandomStreams, epsilon_to_rho
from dplang.textgen.engine import DecodingParams
from dplang.textgen.methods.invisibleink import calibrate_clip, run_invisibleink
from row_invariance import B, yelp_jobs  # the same jobs as the side-by-side benchmark

K, TAU, EPS, DELTA = 50, 1.2, 10.0, 1e-6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    spent: dict[str, float] = defaultdict(float)
    marks: list[dict[str, float]] = []

    def timed(name: str, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - start
        return wrapper

    exact.exact_products = timed("products", exact.exact_products)
    exact.packed_products = timed("products", exact.packed_products)
    cpu_kernels.attend_tokens = timed("attention", cpu_kernels.attend_tokens)
    # the rest of a step, part by part (leaf functions only: no time is counted twice)
    for name in ("rms_norm", "quantize_limbs", "quantize", "combine", "residual_limbs",
                 "gated_limbs", "qkv_heads", "rotary", "hadamard", "gelu_tanh_mul", "silu_mul"):
        setattr(cpu_kernels, name, timed(name, getattr(cpu_kernels, name)))
    from dplang.models import attention, decoder
    from dplang.textgen.methods import invisibleink

    attention.SlotCache.write = timed("cache write", attention.SlotCache.write)
    exact.IntegerLinear._gathered_block = timed("sparse head", exact.IntegerLinear._gathered_block)
    cpu_kernels.gathered_head = timed("sparse head", cpu_kernels.gathered_head)
    compiled = cpu_kernels._kernels
    bounded_head = {"head_bounds": "head bounds", "superset_logits": "superset exact logits"}

    class _TimedKernels:  # the bounded public head's two compiled loops (leaves: no products)
        def __getitem__(self, name: str):
            kernel = compiled()[name]
            return timed(bounded_head[name], kernel) if name in bounded_head else kernel

    cpu_kernels._kernels = _TimedKernels
    forward_tokens: list[int] = []  # tokens of each forward call (the prefill's first)
    real_forward = decoder.ExactDecoder.forward

    def counted_forward(self, ids, *a, **k):
        forward_tokens.append(int(ids.shape[0]))
        return real_forward(self, ids, *a, **k)

    decoder.ExactDecoder.forward = counted_forward
    policy = invisibleink.InvisibleInkPolicy
    policy.candidates = timed("Top-k+ candidates", policy.candidates)
    policy.choose = timed("sampler", policy.choose)
    start = time.perf_counter()
    model = load_default_model(dtype=args.dtype)
    load_s = time.perf_counter() - start
    jobs = yelp_jobs(model, args.groups)
    clip = calibrate_clip(epsilon_to_rho(EPS, DELTA), args.tokens, B, TAU)
    params = DecodingParams(clip, B, TAU, K, args.tokens, sparse_head=True, stop_at_eos=False)
    stamps: list[float] = []

    prefill_tokens: list[int] = []

    def on_step(_n: int) -> None:
        if not stamps:  # the prefill's forward calls, then the first step's
            prefill_tokens.append(sum(forward_tokens))
        stamps.append(time.perf_counter())
        marks.append(dict(spent))

    forward_tokens.clear()  # (the load-time check's forward calls are not the prefill,
    spent.clear()  # nor its time)
    start = time.perf_counter()
    run_invisibleink(model, jobs, params, RandomStreams(0), concurrent_groups=args.groups,
                     on_step=on_step)
    total = time.perf_counter() - start
    steps = [b - a for a, b in itertools.pairwise(stamps)]
    names = sorted({name for mark in marks for name in mark})
    per_step = {name: [b.get(name, 0.0) - a.get(name, 0.0)
                       for a, b in itertools.pairwise(marks)] for name in names}
    per_step.setdefault("products", [0.0])
    per_step.setdefault("attention", [0.0])
    step = statistics.median(steps)
    products = statistics.median(per_step["products"])
    attention = statistics.median(per_step["attention"])
    prefill = stamps[0] - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"default model ({args.dtype}) loaded in {load_s:.1f} s; {torch.get_num_threads()} "
          f"threads; G = {args.groups}, B = {B}, T = {args.tokens}, EOS ignored")
    print(f"whole run {total:.1f} s: {args.groups * args.tokens / total:.2f} DP tokens/s; "
          f"prefill and first step {prefill:.1f} s: {prefill_tokens[0]} prompt tokens "
          f"(shared prefixes once per group), {prefill_tokens[0] / prefill:.0f} tokens/s, "
          f"{prefill_tokens[0] / prefill / torch.get_num_threads():.0f} per thread")
    print(f"decode step (median of {len(steps)}): {1e3 * step:.0f} ms; integer products "
          f"{1e3 * products:.0f} ms; attention {1e3 * attention:.0f} ms; "
          f"step / products = {step / products:.2f} (target <= 1.5)")
    print(f"peak resident memory {rss:.0f} MiB")
    first = marks[0]  # the prefill and the first step, before any decode step
    print("the prefill and first step, part by part (s): " + ", ".join(
        f"{name} {value:.2f}" for name, value in sorted(first.items(), key=lambda kv: -kv[1]))
          + f", everything else {prefill - sum(first.values()):.2f}")
    parts = {name: statistics.median(values) for name, values in per_step.items()}
    print("a decode step, part by part (median ms): " + ", ".join(
        f"{name} {1e3 * value:.1f}" for name, value in sorted(parts.items(),
                                                              key=lambda kv: -kv[1]))
          + f", everything else {1e3 * (step - sum(parts.values())):.1f}")


if __name__ == "__main__":
    main()
