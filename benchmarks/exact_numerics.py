"""What dplang's exact integer arithmetic costs in model quality, against the float32 model.

    .venv/bin/python benchmarks/exact_numerics.py [--texts 500] [--tokens 128]

The default model's own float32 forward (``transformers``) is the reference. On ``--texts``
Yelp reviews (rows 4000 on of ``../shared/data/yelp/dev.csv``, each cut to ``--tokens``
tokens) it prints, per configuration, the mean and 99th percentile of the next-token KL
divergence KL(reference || configuration) over every position, the perplexity of the texts
and the share of positions whose most likely token is the reference's:

* dplang ``--dtype float32`` (16-bit weights, 15-bit activations, exact attention);
* dplang ``--dtype bfloat16`` (8-bit body weights, 16-bit head);
* ``transformers``' bfloat16 model (for scale: what a bfloat16 run of the same weights
  gives).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from dplang.models.default import ensure_default_model
from dplang.models.transformers import TransformersModel

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "yelp" / "dev.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=8,
                    help="texts per dplang call (row-invariant: the figures do not depend on it)")
    args = ap.parse_args()
    folder = ensure_default_model()
    texts = pd.read_csv(DATA)["text"].tolist()[4000:4000 + args.texts]
    fp32 = TransformersModel(folder, check_invariance=False, keep_reference=True)
    reference = fp32.model
    half = TransformersModel(folder, dtype="bfloat16", check_invariance=False)
    hf_bf16 = TransformersModel(folder, check_invariance=False, keep_reference=True,
                                verify=False).model.to(torch.bfloat16)
    seqs = [fp32.tokenizer(t)["input_ids"][: args.tokens] for t in texts]
    names = ("dplang float32", "dplang bfloat16", "transformers bfloat16")
    stats: dict[str, dict[str, list[torch.Tensor]]] = {
        n: {"kl": [], "nll": [], "agree": []} for n in names}
    ref_nll: list[torch.Tensor] = []
    seconds = dict.fromkeys(names, 0.0)
    start = time.perf_counter()
    for first in range(0, len(seqs), args.chunk):
        chunk = seqs[first:first + args.chunk]
        refs = []
        for ids in chunk:
            with torch.no_grad():
                logits = reference(input_ids=torch.tensor([ids])).logits[0].float()
            refs.append(torch.log_softmax(logits, -1))
            ref_nll.append(-refs[-1][:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0])
        for name in names:
            t0 = time.perf_counter()
            if name == "transformers bfloat16":
                with torch.no_grad():
                    got_all = [hf_bf16(input_ids=torch.tensor([ids])).logits[0].float()
                               for ids in chunk]
            else:  # the chunk's texts as one batch: row-invariant, so the same bits as alone
                model = fp32 if name == "dplang float32" else half
                got_all = [model.logits_from_hidden(h)
                           for h in model.token_hidden_states(chunk)]
            seconds[name] += time.perf_counter() - t0
            for ids, ref, logits in zip(chunk, refs, got_all, strict=True):
                target = torch.tensor(ids[1:])
                got = torch.log_softmax(logits, -1)
                stats[name]["kl"].append((ref.exp() * (ref - got)).sum(-1))
                stats[name]["nll"].append(-got[:-1].gather(1, target[:, None])[:, 0])
                stats[name]["agree"].append((ref.argmax(-1) == got.argmax(-1)).float())
        done = first + len(chunk)
        elapsed = time.perf_counter() - start
        print(f"{done}/{len(seqs)} texts, {elapsed:.0f} s, about "
              f"{elapsed / done * (len(seqs) - done):.0f} s left", flush=True)
    positions = sum(len(s) for s in seqs)
    print(f"{len(seqs)} Yelp texts, {positions} positions (at most {args.tokens} tokens each); "
          f"reference: the default model's float32 forward (transformers); "
          f"{time.perf_counter() - start:.0f} s in all")
    print(f"reference perplexity {torch.cat(ref_nll).mean().exp():.3f}")
    print(f"{'configuration':>22} {'KL mean':>10} {'KL p99':>10} {'perplexity':>11} "
          f"{'top-1 agree':>12} {'seconds':>8}")
    for name in names:
        kl = torch.cat(stats[name]["kl"])
        nll = torch.cat(stats[name]["nll"])
        agree = torch.cat(stats[name]["agree"])
        print(f"{name:>22} {kl.mean():>10.2e} {kl.quantile(0.99):>10.2e} "
              f"{nll.mean().exp():>11.3f} {agree.mean():>12.4f} {seconds[name]:>8.0f}")


if __name__ == "__main__":
    main()
