"""The exact integer products by kernel, side by side: torch._int_mm against the float32 chunks.

    PYTHONPATH=benchmarks .venv/bin/python benchmarks/product_kernels.py [--groups 2]
                                           [--rounds 3] [--steps 4] [--dtype bfloat16]

Two parts, one process, 2 threads (``DPLANG_THREADS`` or torch's setting otherwise):

1. The raw kernels at the default model's shapes (its body's linears at 16 and 32 limb rows,
   and one 8,192-column block of its LM head's bounds): ``torch._int_mm``, the float32 chunks
   of :func:`dplang.models.exact.exact_products`, and, for the head, the compiled int8 dot
   products (:func:`dplang.models.cpu_kernels.weight_products`). Each checked to give the same
   integers.
2. Decode steps of the default model (bfloat16, the runs' default, or float32; G groups of
   B = 7 Yelp prompts, each round's prefill run with the float32 chunks, untimed) with every
   linear on one kernel: ``int8``
   (``torch._int_mm``; packed weights off), ``float32 chunks`` (the head's bounds from float32
   chunks too) and ``float32`` (what :func:`dplang.models.exact.product_kernel` chooses on a CPU
   without int8 dot products: the head's bounds from the compiled int8 dot products),
   alternating the order round by round, the hidden states checked bit for bit against the
   first run.

Prints the CPU's int8 capability (what decides the kernel), medians and ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator

import torch

from dplang.models import cpu_kernels, exact, kernels, packed_int8
from dplang.models.default import load_default_model
from dplang.models.transformers import RowDecodeState
from row_invariance import yelp_jobs

VARIANTS = ("int8", "float32 chunks", "float32")


def best_of(fn: Callable[[], object], seconds: float = 1.0) -> float:
    fn()
    times: list[float] = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop or len(times) < 3:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def raw_kernels() -> None:
    gen = torch.Generator().manual_seed(0)
    print(f"{'shape (rows x K x N)':>24}  {'torch._int_mm':>13}  {'float32':>9}  "
          f"{'compiled':>9}  (best ms)")
    for rows, k, n in [(16, 640, 1536), (32, 640, 2048), (16, 2048, 640), (32, 1024, 640)]:
        left = torch.randint(-128, 128, (rows, k), generator=gen, dtype=torch.int8)
        right = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8).t()
        assert torch.equal(exact.exact_products(left, right, "int8"),
                           exact.exact_products(left, right, "float32"))
        t_int = best_of(lambda a=left, b=right: exact.exact_products(a, b, "int8"))
        t_f32 = best_of(lambda a=left, b=right: exact.exact_products(a, b, "float32"))
        print(f"{f'{rows} x {k} x {n}':>24}  {1e3 * t_int:>13.2f}  {1e3 * t_f32:>9.2f}  "
              f"{'':>9}")
    head = torch.randint(-128, 128, (8192, 640), generator=gen, dtype=torch.int8)
    limbs = torch.randint(-128, 128, (4, 640), generator=gen, dtype=torch.int8)
    right = limbs.t().contiguous()
    want = exact.exact_products(head, right, "float32")
    assert torch.equal(exact.exact_products(head, right, "int8"), want)
    assert torch.equal(cpu_kernels.weight_products(head, limbs), want)
    t_int = best_of(lambda: exact.exact_products(head, right, "int8"))
    t_f32 = best_of(lambda: exact.exact_products(head, right, "float32"))
    t_num = best_of(lambda: cpu_kernels.weight_products(head, limbs))
    print(f"{'head block 8192 x 640 x 4':>24}  {1e3 * t_int:>13.2f}  {1e3 * t_f32:>9.2f}  "
          f"{1e3 * t_num:>9.2f}   (x 32 blocks per decode step)")


@contextlib.contextmanager
def variant(linears: list[exact.IntegerLinear], name: str) -> Iterator[None]:
    kept = [(lin.kernel, lin.packed) for lin in linears]
    lookup = kernels.lookup
    for lin in linears:
        lin.kernel = "int8" if name == "int8" else "float32"
        lin.packed = None
    if name == "float32 chunks":
        kernels.lookup = lambda op, t: None if op == "weight_products" else lookup(op, t)
    try:
        yield
    finally:
        kernels.lookup = lookup
        for lin, (kernel, packed) in zip(linears, kept, strict=True):
            lin.kernel, lin.packed = kernel, packed


def decode_steps(groups: int, rounds: int, steps: int, dtype: str) -> None:
    model = load_default_model(dtype=dtype)
    linears = [m for m in gc.get_objects() if isinstance(m, exact.IntegerLinear)]
    jobs = yelp_jobs(model, groups)
    prompts = [p for job in jobs for p in (job.public_prompt, *job.private_prompts)]
    prefixes = [job.prefix or None for job in jobs for _ in range(1 + len(job.private_prompts))]

    def run(name: str) -> tuple[float, list[torch.Tensor]]:
        state = RowDecodeState(prompts=[])
        with variant(linears, "float32"):
            model.add_prompts(state, prompts, prefixes)
            seen = [model.next_hidden(state, None)]
        gen = torch.Generator().manual_seed(0)
        tokens = [torch.randint(3, model.vocab_size, (state.rows,), generator=gen)
                  for _ in range(steps)]
        with variant(linears, name):
            start = time.perf_counter()
            for step_tokens in tokens:
                hidden = model.next_hidden(state, step_tokens)
                # the public rows' LM head (each group's first row), as the engine asks it
                found = model.top_superset_logits(hidden[::8], 50, 0.4, None)
                if found is None:
                    raise SystemExit("the bounded LM head declined: its time is not measured")
                seen.extend((hidden, found[0], found[2]))  # ids and logits compared too
            return (time.perf_counter() - start) / steps, seen

    reference = run("float32")[1]  # a warm-up (compiled kernels, first-touch pages)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for r in range(rounds):
        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
        for name in order:
            step, seen = run(name)
            if not all(torch.equal(a.view(torch.int32), b.view(torch.int32))
                       for a, b in zip(seen, reference, strict=True)):
                raise SystemExit(f"{name}: other bits than the first run")
            times[name].append(step)
            print(f"round {r + 1} {name:>15}: decode step {1e3 * step:.0f} ms", flush=True)
    print(f"\n{dtype}: {len(prompts)} rows ({groups} groups, B = 7), "
          f"{torch.get_num_threads()} threads, "
          f"{rounds} rounds, {steps} steps each, the same bits")
    base = statistics.median(times["int8"])
    for name in VARIANTS:
        med = statistics.median(times[name])
        print(f"{name:>15}: decode step median {1e3 * med:.0f} ms, best "
              f"{1e3 * min(times[name]):.0f} ms; int8 / this {base / med:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="decode steps timed per round")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    args = ap.parse_args()
    print(f"CPU with int8 dot products (VNNI/AMX, oneDNN unrestricted): "
          f"{packed_int8.cpu_multiplies_int8_exactly()}; the model's kernel here: "
          f"{exact.product_kernel('cpu', 640)}")
    raw_kernels()
    decode_steps(args.groups, args.rounds, args.steps, args.dtype)


if __name__ == "__main__":
    main()
