"""NOT PRIVATE: generation from the same private prompts with no clipping and no noise.

The ceiling of what references can add in an experiment: every generation reads its batch of B
references exactly as InvisibleInk does (the same batches, the same private prompts, one
public row), but the next token is drawn from the plain mean of the private logits,

    φ̄ = (1/B) Σ_i φ_i        (an empty reference contributes the public logits φ_pub)
    x_t ~ softmax(φ̄/τ) restricted to the top-k of φ̄ (k = 0: the whole vocabulary),

with no clip norm, no Top-k+ set from the public logits and no noise. It costs the same B + 1
model calls per token as InvisibleInk at the same B (the private rows are dense: the top-k is
that of the private mean). Comparing a private method with it at the same B says what the
privacy costs in quality; comparing it with public-only generation says what the references
can add at all with this model and prompt.

Privacy contract: **none.** One reference can change a generation arbitrarily, so the release
does not satisfy differential privacy for any ε. Its guarantee says so in words
(``Guarantee.non_private``: ``epsilon = ∞``, ``ex_ante = False``, mechanism ``nonprivate``): the
public manifest, the ledger (recorded outside every DP total; a dataset with a budget refuses
it, as it refuses AdaPMixED) and the sweep's results (ε = ∞) all carry that label, so the
output cannot be mistaken for a private release. It takes no privacy budget (no ``--epsilon``,
``--rho`` or ``--clip``). Use it on public benchmarks, as an experiment's reference point only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._lazy import lazy_module
from ...privacy.guarantees import Adjacency, Guarantee
from ..engine import GroupJob, StepPolicy
from .invisibleink import sample_from_candidates
from .registry import MethodInputs, MethodSpec, register_method

torch = lazy_module("torch")  # imported on first use (`dplang generate --help` needs none)

#: The words every summary of this method's output starts with.
NOT_PRIVATE = "NOT PRIVATE"


class NonPrivatePolicy:
    """One generation: top-k sampling at temperature τ from the mean of the private logits
    (dense rows), with the public logits standing in for each empty reference."""

    def __init__(self, batch_size: int, temperature: float, top_k: int) -> None:
        self.batch_size, self.temperature, self.top_k = batch_size, temperature, top_k
        self.steps = 0

    def candidates(self, public: torch.Tensor) -> None:
        return None  # every private logit is read: the top-k is that of the private mean

    def scores(self, public: torch.Tensor, private: torch.Tensor) -> tuple[np.ndarray,
                                                                            np.ndarray]:
        """(token ids, float64 logits) of the next draw: the top-k of the mean of the private
        rows (and of the public row once per empty reference)."""
        pub = public.detach().to(torch.float64).cpu().numpy()
        rows = private.detach().to(torch.float64).cpu().numpy().reshape(-1, pub.size)
        nulls = self.batch_size - rows.shape[0]
        mean = (rows.sum(axis=0) + nulls * pub) / self.batch_size
        allowed = np.flatnonzero(np.isfinite(mean))
        if allowed.size == 0:
            raise ValueError("the private logits allow no token (all NaN or -inf)")
        if 0 < self.top_k < allowed.size:
            top = np.argpartition(mean[allowed], allowed.size - self.top_k)
            allowed = np.sort(allowed[top[allowed.size - self.top_k:]])
        return allowed, mean[allowed]

    def choose(self, public: torch.Tensor, private: torch.Tensor, ids: torch.Tensor | None,
               rng: np.random.Generator) -> int:
        token_ids, logits = self.scores(public, private)
        self.steps += 1
        return sample_from_candidates(logits, token_ids, self.temperature, rng)

    def stats(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class NonPrivateParams:
    """The non-private ceiling's parameters. Privacy contract: none (see the module)."""

    batch_size: int
    temperature: float
    top_k: int
    max_tokens: int
    adjacency: Adjacency = Adjacency.REPLACE_BY_NULL
    clip: float = 0.0

    @classmethod
    def calibrate(cls, inputs: MethodInputs, options: Mapping[str, Any]) -> NonPrivateParams:
        if any(v is not None for v in (inputs.epsilon, inputs.rho, inputs.clip)):
            raise ValueError("takes no privacy budget: it is not private (leave out --epsilon, "
                             "--rho and --clip)")
        return cls(inputs.batch_size, inputs.temperature, inputs.top_k, inputs.max_tokens,
                   Adjacency(inputs.adjacency))

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """ε = ∞, not ex ante: no guarantee at all, whatever ``n`` and ``d``."""
        return Guarantee.non_private(
            "nonprivate", "reference", self.adjacency,
            details={"accounting": f"{NOT_PRIVATE}: no clipping, no noise (ε = ∞); a "
                     "non-private ceiling for experiments, never a private release",
                     "batch_size": self.batch_size, "temperature": self.temperature,
                     "top_k": self.top_k, "max_tokens": self.max_tokens})

    def policy_factory(self, vocab_size: int) -> Callable[[GroupJob], StepPolicy]:
        return lambda _job: NonPrivatePolicy(self.batch_size, self.temperature, self.top_k)


SPEC = register_method(MethodSpec(
    name="nonprivate",
    summary="NOT PRIVATE: the same private prompts, no clipping, no noise (ε = ∞): the "
            "ceiling of what references add, for experiments only",
    adjacencies=(Adjacency.REPLACE_BY_NULL,),
    calibrate=NonPrivateParams.calibrate,
    budget_forms=(),
))
