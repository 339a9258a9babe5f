"""Cost of one decode step of the default model, measured side by side.

    .venv/bin/python benchmarks/model_step.py [--threads 2] [--rows 1 8 32 64] [--steps 12]

Prompts are Yelp reviews from ``../shared/data/yelp/dev.csv`` cut to ~100 tokens (a built-in
paragraph if the file is missing). For every row count the script runs the prompts, then decodes
``--steps`` greedy steps and prints, in milliseconds, the best and the median time of

* ``step``: ``next_hidden`` + full LM head (what one dense decode step costs),
* ``body``: ``next_hidden`` alone (transformer body with the KV cache),
* ``head``: the full LM head over the 262,144-token vocabulary,
* ``sparse``: the LM head on ``--k`` candidates per row,
* ``naive head``: the full head written as ``hidden @ W.T``,
* ``stock body``: ``next_hidden`` with ``transformers``' stock ``DynamicCache`` and plain
  ``F.linear`` layers (decoded in lockstep with the optimised configuration),
* ``stock step``: stock body + naive head, i.e. the step without this backend's CPU
  optimisations,

and the prompt (prefill) time. The best of the steps is the figure to compare when other
processes share the cores; the median shows how noisy the run was.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dplang.models import TransformersModel, load_default_model

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "yelp" / "dev.csv"
FALLBACK = (
    "We came here for dinner on a Friday night and the place was packed, which is always a "
    "good sign. The staff found us a table within ten minutes and the waiter was friendly and "
    "quick with recommendations. The pasta was fresh and perfectly cooked, the sauce rich but "
    "not heavy, and the tiramisu at the end was the best I have had in years. Prices are fair "
    "for the portion sizes. Parking can be tricky on weekends, so plan ahead. "
)


def load_prompts(model: TransformersModel, n: int, tokens: int) -> list[str]:
    """``n`` prompts of about ``tokens`` tokens."""
    texts: list[str] = []
    if DATA.is_file():
        with DATA.open(newline="", encoding="utf-8") as handle:
            for record in csv.DictReader(handle):
                text = record["text"]
                if model.count_tokens(text) >= tokens:
                    texts.append(model.truncate_tokens(text, tokens))
                if len(texts) == n:
                    break
    while len(texts) < n:
        start = len(texts) * 7 % len(FALLBACK)
        texts.append(model.truncate_tokens((FALLBACK[start:] + FALLBACK) * 2, tokens))
    return texts


def summarise(samples: list[float]) -> tuple[float, float]:
    """(best, median) in milliseconds."""
    return 1e3 * min(samples), 1e3 * statistics.median(samples)


def timed(fn: Callable[..., torch.Tensor], *args: object) -> tuple[torch.Tensor, float]:
    """``fn(*args)`` and its wall time in seconds."""
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def measure(
    model: TransformersModel,
    stock: TransformersModel,
    prompts: list[str],
    steps: int,
    k: int,
    warmup: int = 2,
) -> dict[str, tuple[float, float]]:
    """Timings (best, median; ms) of the parts of a decode step over ``steps`` greedy steps.

    The optimised and the stock configuration decode the same prompts in lockstep, so that
    other load on the machine affects both alike.
    """
    weight = model._head_weight
    gen = torch.Generator().manual_seed(0)
    candidates = torch.stack([torch.randperm(model.vocab_size, generator=gen)[:k] for _ in prompts])
    state = model.encode_prompts(prompts)
    stock_state = stock.encode_prompts(prompts)
    hidden, prefill = timed(model.next_hidden, state, None)
    stock.next_hidden(stock_state, None)
    keys = ("step", "body", "head", "sparse", "naive head", "stock body", "stock step")
    samples: dict[str, list[float]] = {key: [] for key in keys}
    for step in range(warmup + steps):
        logits, t_head = timed(model.logits_from_hidden, hidden)
        _, t_sparse = timed(model.logits_from_hidden, hidden, candidates)
        with torch.no_grad():
            _, t_naive = timed(torch.matmul, hidden, weight.T)
        tokens = logits.argmax(dim=-1)
        hidden, t_body = timed(model.next_hidden, state, tokens)
        _, t_stock = timed(stock.next_hidden, stock_state, tokens)
        if step >= warmup:
            for key, value in zip(
                keys,
                (t_body + t_head, t_body, t_head, t_sparse, t_naive, t_stock, t_stock + t_naive),
                strict=True,
            ):
                samples[key].append(value)
    result = {key: summarise(values) for key, values in samples.items()}
    result["prefill"] = (1e3 * prefill, 1e3 * prefill)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=100, help="prompt length in tokens")
    parser.add_argument("--k", type=int, default=60, help="candidates for the sparse head")
    args = parser.parse_args()

    start = time.perf_counter()
    model = load_default_model(threads=args.threads)
    print(f"model: {model.model_id}  (loaded in {time.perf_counter() - start:.1f} s)")
    stock = TransformersModel(
        model=model.model,
        tokenizer=model.tokenizer,
        threads=args.threads,
        buffered_cache=False,
        blocked_linear=False,
        packed_weights=False,
        ragged_attention=False,
        verify=False,
    )
    print(
        f"threads={torch.get_num_threads()}  attention={model.config._attn_implementation}  "
        f"prompt≈{args.tokens} tokens  K={args.k}  {args.steps} timed steps, ms"
    )
    columns = ("step", "body", "head", "sparse", "naive head", "stock body", "stock step")
    header = f"{'rows':>5} " + " ".join(f"{c:>11}" for c in columns) + f" {'prefill':>9}"
    print("best of the steps (median in parentheses)")
    print(header)
    print("-" * len(header))
    prompts_all = load_prompts(model, max(args.rows), args.tokens)
    for rows in args.rows:
        result = measure(model, stock, prompts_all[:rows], args.steps, args.k)
        cells = " ".join(f"{result[c][0]:>5.1f} ({result[c][1]:>3.0f})" for c in columns)
        print(f"{rows:>5} {cells} {result['prefill'][0]:>9.0f}", flush=True)


if __name__ == "__main__":
    main()
