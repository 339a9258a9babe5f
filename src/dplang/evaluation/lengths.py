"""Text lengths in tokens, and the Top-k+ statistics of a generation run.

Lengths are counted in tokens of a model's tokenizer (no special tokens), as in the paper:
lengths are only comparable under one tokenizer, so real texts are counted with the tokenizer
of ``--model`` and synthetic texts use the ``num_tokens`` that ``dplang generate`` recorded
(tokens of the generating model, EOS excluded) when that model is the same, or are re-counted
with ``--model``'s tokenizer otherwise.

Top-k+ statistics (InvisibleInk paper, Appendix D and Table 12), from the generation output:

* **effective k** — mean over generations of ``topk_plus_mean`` (each generation's average
  ``|V_k^+|`` over its decoding steps);
* **expansion tokens** — mean over generations of ``expansion_tokens`` (tokens sampled from
  ``V_k^+ \\ V_k`` in one generation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dplang.evaluation.data import EvaluationError, SyntheticRun
from dplang.evaluation.stats import Interval, wald_interval

__all__ = ["TopkStats", "load_tokenizer", "token_lengths", "topk_statistics"]


def load_tokenizer(spec: str) -> Any:
    """The tokenizer of ``--model``: ``"default"`` (Gemma 3 270M, converted once into the
    dplang cache), a model folder or a ``.gguf`` file. Only the tokenizer is loaded."""
    from dplang.models.tokenizer_loading import load_tokenizer as load_model_tokenizer

    if spec == "default":
        from dplang.models.default import ensure_default_model

        return load_model_tokenizer(ensure_default_model())
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model not found: {spec!r} is not 'default', a model folder or a .gguf file"
        )
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise FileNotFoundError(f"model file {spec!r} is not a .gguf file")
        return load_model_tokenizer(path.parent, path.name)
    return load_model_tokenizer(path)


def token_lengths(texts: Sequence[str], tokenizer: Any) -> np.ndarray:
    """Number of tokens of every text under ``tokenizer`` (no special tokens)."""
    if not texts:
        return np.zeros(0, dtype=np.int64)
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return np.array([len(ids) for ids in encoded], dtype=np.int64)


@dataclass(frozen=True)
class TopkStats:
    """Top-k+ statistics of one run (means over generations with 99% Wald intervals).

    Attributes:
        effective_k: mean of ``topk_plus_mean``.
        expansion_tokens: mean of ``expansion_tokens``.
        expansion_fraction: mean over generations of ``expansion_tokens / num_tokens``
            (generations with no token left out).
        top_k: ``k`` from the manifest (``None`` when unknown; 0 = full vocabulary).
    """

    effective_k: Interval
    expansion_tokens: Interval
    expansion_fraction: Interval
    top_k: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "top_k": self.top_k,
            "effective_k": self.effective_k.to_dict(),
            "expansion_tokens": self.expansion_tokens.to_dict(),
            "expansion_fraction": self.expansion_fraction.to_dict(),
        }


def topk_statistics(run: SyntheticRun) -> TopkStats:
    """Top-k+ statistics of ``run`` (records must carry ``topk_plus_mean`` and
    ``expansion_tokens``, as ``dplang generate`` writes them)."""
    for key in ("topk_plus_mean", "expansion_tokens"):
        if not run.has_field(key):
            raise EvaluationError(
                f"{run.path}: no Top-k+ statistics ({key!r} missing; not a dplang generate "
                "output?); leave 'topk' out of --metrics"
            )
    eff = [float(r["topk_plus_mean"]) for r in run.records]
    exp = [float(r["expansion_tokens"]) for r in run.records]
    frac = [
        float(r["expansion_tokens"]) / float(r["num_tokens"])
        for r in run.records
        if r.get("num_tokens")
    ]
    top_k = run.parameters.get("top_k")
    return TopkStats(
        wald_interval(eff),
        wald_interval(exp),
        wald_interval(frac),
        int(top_k) if top_k is not None else None,
    )
