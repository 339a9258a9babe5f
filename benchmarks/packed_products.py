"""The body's products with weights packed once for oneDNN against torch._int_mm, side by side.

    PYTHONPATH=benchmarks .venv/bin/python benchmarks/packed_products.py [--groups 8]
                                                                       [--rounds 5]

One process, the default model (bfloat16): the prefill of G groups of B = 7 Yelp prompts (the
public and private prompts, shared prefixes once per group, as the engine feeds them) and then
decode steps of those rows, each with the linears' packed weights (dplang.models.packed_int8)
and without (``torch._int_mm``), alternating round by round (after one warm-up run of each)
so that the machine's drift hits both alike. Prints the best and median seconds of each and
their ratio, and checks that both give the same hidden states bit for bit.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time
from collections.abc import Iterator

import torch

from dplang.models import exact, packed_int8
from dplang.models.default import load_default_model
from dplang.models.transformers import RowDecodeState
from row_invariance import yelp_jobs


@contextlib.contextmanager
def unpacked(linears: list[exact.IntegerLinear]) -> Iterator[None]:
    kept = [lin.packed for lin in linears]
    for lin in linears:
        lin.packed = None
    try:
        yield
    finally:
        for lin, packed in zip(linears, kept, strict=True):
            lin.packed = packed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed per round")
    args = ap.parse_args()
    model = load_default_model(dtype="bfloat16")
    linears = [m for m in gc.get_objects() if isinstance(m, exact.IntegerLinear)]
    packed = [lin for lin in linears if lin.packed is not None]
    if not packed:
        raise SystemExit("no weight is packed on this machine (no VNNI/AMX, or "
                         "DPLANG_NO_PACKED_INT8 is set): nothing to compare")
    jobs = yelp_jobs(model, args.groups)
    prompts = [p for job in jobs for p in (job.public_prompt, *job.private_prompts)]
    prefixes = [job.prefix or None for job in jobs for _ in range(1 + len(job.private_prompts))]

    def run() -> tuple[float, float, list[torch.Tensor]]:
        state = RowDecodeState(prompts=[])
        model.add_prompts(state, prompts, prefixes)
        start = time.perf_counter()
        hidden = model.next_hidden(state, None)
        prefill = time.perf_counter() - start
        seen = [hidden]
        gen = torch.Generator().manual_seed(0)
        start = time.perf_counter()
        for _ in range(args.steps):
            tokens = torch.randint(3, model.vocab_size, (state.rows,), generator=gen)
            seen.append(model.next_hidden(state, tokens))
        step = (time.perf_counter() - start) / args.steps
        return prefill, step, seen

    times: dict[str, list[tuple[float, float]]] = {"packed": [], "torch._int_mm": []}
    reference = run()[2]  # a warm-up (compiled kernels, first-touch pages), not timed
    with unpacked(packed):
        run()
    for r in range(args.rounds):
        for name in (("packed", "torch._int_mm") if r % 2 == 0 else
                     ("torch._int_mm", "packed")):
            with contextlib.nullcontext() if name == "packed" else unpacked(packed):
                prefill, step, seen = run()
            times[name].append((prefill, step))
            if not all(torch.equal(a.view(torch.int32), b.view(torch.int32))
                         for a, b in zip(seen, reference, strict=True)):
                raise SystemExit(f"{name}: other bits than the first run")
            print(f"round {r + 1} {name:>14}: prefill {prefill:.2f} s, "
                  f"decode step {1e3 * step:.0f} ms", flush=True)
    print(f"\n{len(prompts)} prompts of {args.groups} groups (B = 7, shared prefixes once), "
          f"{len(packed)} of {len(linears)} linears packed, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds each, the same bits")
    print(f"{'products':>14}  {'prefill best':>12}  {'median':>7}  {'step best':>9}  {'median':>7}")
    for name, values in times.items():
        pre = [v[0] for v in values]
        st = [1e3 * v[1] for v in values]
        print(f"{name:>14}  {min(pre):>10.2f} s  {statistics.median(pre):>5.2f} s  "
              f"{min(st):>6.0f} ms  {statistics.median(st):>4.0f} ms")
    p, u = times["packed"], times["torch._int_mm"]
    print(f"packed / torch._int_mm: prefill {min(v[0] for v in p) / min(v[0] for v in u):.2f}x "
          f"(best), {statistics.median(v[0] for v in p) / statistics.median(v[0] for v in u):.2f}x "
          f"(median); decode step {min(v[1] for v in p) / min(v[1] for v in u):.2f}x (best), "
          f"{statistics.median(v[1] for v in p) / statistics.median(v[1] for v in u):.2f}x "
          "(median)")
    print(f"machine: VNNI/AMX {packed_int8.cpu_multiplies_int8_exactly()}")


if __name__ == "__main__":
    main()
