"""Public-only generation: the model with the public prompt alone (no references).

This is the ε = 0 baseline of the paper's experiments ("public-only generation"): it reads no
private text, so its output carries a zero guarantee. Labels used in prompts (for example Yelp
category and stars) are public metadata, exactly as in private generation. Sampling is
non-private top-k sampling with temperature τ (``k = 0``: the full vocabulary).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from ..models.base import LogitsModel
from ..privacy.guarantees import Guarantee
from ..privacy.randomness import RandomStreams
from ..release import OutputPaths
from .engine import run_plain
from .prompts import PromptTemplate

PUBLIC_GUARANTEE = Guarantee.zcdp("public-only", "reference", "replace-by-null", 0.0, 0.0,
                                  details={"note": "reads no private data"})


def generate_public_texts(
    model: LogitsModel,
    template: PromptTemplate,
    labels: Sequence[Mapping[str, str]],
    max_tokens: int,
    temperature: float,
    top_k: int,
    seed: int,
    out: Path,
    concurrent: int = 64,
) -> list[dict[str, Any]]:
    """One text per entry of ``labels`` from the public prompt; writes ``out`` (JSONL, same
    record format as ``dplang generate``) and its manifest. Returns the records."""
    prompts = [model.render_prompt(template.render(None, lab), template.system) for lab in labels]
    streams = RandomStreams(seed)
    records: list[dict[str, Any]] = []
    for start in range(0, len(prompts), concurrent):
        chunk = prompts[start:start + concurrent]
        outs = run_plain(model, chunk, max_tokens, temperature, top_k, streams,
                         first_stream=start)
        for i, ids in enumerate(outs):
            k = start + i
            records.append({
                "group": k, "text": model.decode(ids), "num_tokens": len(ids),
                "stopped": "length" if len(ids) >= max_tokens else "eos",
                "reference_ids": [], "labels": dict(labels[k]),
                "topk_plus_mean": float(top_k if 0 < top_k < model.vocab_size
                                        else model.vocab_size),
                "topk_plus_std": 0.0, "expansion_tokens": 0, "token_ids": ids,
            })
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    manifest = {
        "dplang_version": __version__, "guarantee": PUBLIC_GUARANTEE.to_dict(),
        "guarantee_summary": "Public-only generation: no private data was read.",
        "rho": 0.0, "epsilon": 0.0, "delta": 0.0, "clip": 0.0, "adjacency": "replace-by-null",
        "fingerprint": {"parameters": {"method": "public", "max_tokens": max_tokens,
                                       "temperature": temperature, "top_k": top_k,
                                       "batch_size": 0},
                        "model_id": model.model_id, "model_sha256": model.weights_digest()},
        "status": "complete",
    }
    OutputPaths.of(out).manifest.write_text(
        json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return records
