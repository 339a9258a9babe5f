"""Cost of one decode step of the default model, measured side by side.

    .venv/bin/python benchmarks/model_step.py [--threads 2] [--rows 1 8 32 64] [--steps 12]

Prompts are Yelp reviews from ``../shared/data/yelp/dev.csv`` cut to ~100 tokens (a built-in
paragraph if the file is missing). For every row count the script runs the prompts, then decodes
``--steps`` greedy steps and prints, in milliseconds, the best and the median time of

* ``step``: ``next_hidden`` + full LM head (what one dense decode step costs),
* ``body``: ``next_hidden`` alone (transformer body with the KV cache),
* ``head``: the full LM head over the 262,144-token vocabulary,
* ``sparse``: the LM head on ``--k`` candidates per row,
* ``naive head``: the full head written as ``hidden @ W.T`` (MKL's plain product),
* ``padded body``: the same body run the usual way -- ``transformers``' own forward over the
  left-padded batch with its ``DynamicCache`` and SDPA attention (same packed linear layers),
  decoded in lockstep; it is *not* row-invariant, so the ratio body / padded body is the cost
  of row-invariant attention and unpadded batching,

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


def _padded_prompts(model: TransformersModel, prompts: list[str]) -> tuple[torch.Tensor, ...]:
    """Left-padded ids and mask of ``prompts`` (the usual batched layout)."""
    encoded = [model._prompt_ids(p) for p in prompts]
    width = max(len(ids) for ids in encoded)
    pad = int(model.tokenizer.pad_token_id or 0)
    ids = torch.full((len(encoded), width), pad, dtype=torch.int64)
    mask = torch.zeros((len(encoded), width), dtype=torch.int64)
    for i, row in enumerate(encoded):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask


def measure(
    model: TransformersModel,
    prompts: list[str],
    steps: int,
    k: int,
    warmup: int = 2,
) -> dict[str, tuple[float, float]]:
    """Timings (best, median; ms) of the parts of a decode step over ``steps`` greedy steps.

    The row-invariant body and the padded ``transformers`` forward decode the same prompts in
    lockstep, so that other load on the machine affects both alike.
    """
    from transformers import DynamicCache

    weight = model._head_weight
    gen = torch.Generator().manual_seed(0)
    candidates = torch.stack([torch.randperm(model.vocab_size, generator=gen)[:k] for _ in prompts])
    state = model.encode_prompts(prompts)
    hidden, prefill = timed(model.next_hidden, state, None)
    ids, mask = _padded_prompts(model, prompts)
    body = model._body
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        body(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    keys = ("step", "body", "head", "sparse", "naive head", "padded body")
    samples: dict[str, list[float]] = {key: [] for key in keys}
    for step in range(warmup + steps):
        logits, t_head = timed(model.logits_from_hidden, hidden)
        _, t_sparse = timed(model.logits_from_hidden, hidden, candidates)
        with torch.no_grad():
            _, t_naive = timed(torch.matmul, hidden, weight.T)
        tokens = logits.argmax(dim=-1)
        hidden, t_body = timed(model.next_hidden, state, tokens)
        mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=mask.dtype)], dim=1)
        start = time.perf_counter()
        with torch.inference_mode():
            body(input_ids=tokens[:, None], attention_mask=mask, past_key_values=cache,
                 use_cache=True)
        t_padded = time.perf_counter() - start
        if step >= warmup:
            for key, value in zip(
                keys, (t_body + t_head, t_body, t_head, t_sparse, t_naive, t_padded),
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
    print(
        f"threads={torch.get_num_threads()}  "
        f"prompt≈{args.tokens} tokens  K={args.k}  {args.steps} timed steps, ms"
    )
    columns = ("step", "body", "head", "sparse", "naive head", "padded body")
    header = f"{'rows':>5} " + " ".join(f"{c:>11}" for c in columns) + f" {'prefill':>9}"
    print("best of the steps (median in parentheses)")
    print(header)
    print("-" * len(header))
    prompts_all = load_prompts(model, max(args.rows), args.tokens)
    for rows in args.rows:
        result = measure(model, prompts_all[:rows], args.steps, args.k)
        cells = " ".join(f"{result[c][0]:>5.1f} ({result[c][1]:>3.0f})" for c in columns)
        print(f"{rows:>5} {cells} {result['prefill'][0]:>9.0f}", flush=True)


if __name__ == "__main__":
    main()
