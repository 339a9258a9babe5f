"""Engine-level exact privacy audit of InvisibleInk.

Everything between the data file and the sampler is the real code: the runner plans the run
(reads the file, forms the batches, renders the prompts, builds the Guarantee it prints and the
step policies), the engine decodes the groups over :class:`~dplang.models.toy.ToyModel`, and the
real :class:`~dplang.textgen.methods.invisibleink.InvisibleInkPolicy` computes each step's
scores. The policy's public ``observer`` hook reports the exact law each draw follows. A
scripted wrapper steers the decoding along every prefix (the law at a prefix is what the
engine computes from the model's rows for that prefix; the wrapper only replaces the sampled
token by the script's), so the exact law of every output sequence is known for two
neighbouring data sets: the same file with one reference replaced by the empty one.

The audit then checks, against the Guarantee the runner built:

* per step and prefix: max log-ratio ≤ 2C/(Bτ) and D_α/α ≤ ρ/T (both directions);
* per sequence: D_α/α ≤ ρ for every α, and the exact δ at the printed ε ≤ the printed δ
  (:func:`dplang.privacy.audit.delta_at_epsilon`, through ``exact_audit``);
* every other group: bit-identical laws (parallel composition over disjoint batches).

Broken twins — no clipping, a Top-k+ set that also takes private top-k tokens — run through the
same engine and the same audit, which must flag them.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from dplang.models import ToyModel
from dplang.privacy import RandomStreams
from dplang.privacy.audit import AuditResult, exact_audit
from dplang.privacy.mechanisms import exponential_mechanism_probabilities
from dplang.textgen.engine import GroupJob, run_groups
from dplang.textgen.methods.invisibleink import (
    InvisibleInkPolicy,
    candidate_scores,
    expanded_topk_mask,
)
from dplang.textgen.orchestration import GenerationRequest, plan_generation

VOCAB, EOS, T, B, G = 7, 0, 3, 3, 2
TAU = 1.0
ALPHAS = (1.01, 1.1, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 100.0)
REFERENCES = [f"reference {i}: the soup was {w}" for i, w in
              enumerate(["cold", "fine", "great", "salty", "warm", "odd"])]
assert len(REFERENCES) == B * G


# --------------------------------------------------------------------------------- harness


def _plan(tmp: Path, references: list[str], top_k: int, sparse: bool, tag: str):
    data = tmp / f"{tag}.jsonl"
    data.write_text("".join(json.dumps({"text": r}) + "\n" for r in references))
    template = tmp / "t.toml"
    template.write_text('private = "Review: {reference}\\nAnother review:"\n'
                        'public = "Another review:"\n')
    model = ToyModel(vocab_size=VOCAB, eos_token_id=EOS, eos_after=None)
    req = GenerationRequest(data=data, out=tmp / f"{tag}.out.jsonl", batch_size=B,
                            max_tokens=T, temperature=TAU, top_k=top_k, epsilon=1.0,
                            delta=1e-6, prompt=str(template), concurrent_groups=G,
                            sparse_head=sparse)
    return plan_generation(req, lambda _spec: model)


@dataclass
class _Scripted:
    """Delegates to the real policy; records the law it samples from; returns the script's
    token instead of the sampled one so that the engine decodes along a chosen prefix."""

    inner: object
    script: tuple[int, ...]
    laws: dict
    index: int
    prefix: list[int] = field(default_factory=list)

    def candidates(self, public):
        return self.inner.candidates(public)

    def choose(self, public, private, ids, rng):
        key = (self.index, tuple(self.prefix))

        def observe(cand, scores, tau):
            law = np.zeros(VOCAB)
            law[cand] = exponential_mechanism_probabilities(scores, tau)
            if key in self.laws:  # the same prefix seen in another run: the same law
                assert np.array_equal(self.laws[key], law)
            self.laws[key] = law

        self.inner.observer = observe
        sampled = self.inner.choose(public, private, ids, rng)
        token = self.script[len(self.prefix)] if len(self.prefix) < len(self.script) else sampled
        self.prefix.append(token)
        return token

    def stats(self):
        return {}


def step_laws(plan, make_policy: Callable[[GroupJob], object] | None = None) -> dict:
    """{(group, prefix): exact next-token law} for every non-EOS prefix shorter than T."""
    factory = plan.make_policy if make_policy is None else make_policy
    laws: dict = {}
    tokens = [t for t in range(VOCAB) if t != EOS]
    for script in itertools.product(tokens, repeat=T - 1):
        run_groups(plan.model, plan.jobs,
                   lambda job, s=script: _Scripted(factory(job), s, laws, job.index),
                   plan.params.batch_size, plan.params.max_tokens, RandomStreams(0),
                   concurrent_groups=G, sparse_head=plan.params.sparse_head)
    return laws


def sequence_law(laws: dict, group: int) -> np.ndarray:
    """Exact law of the whole output of one group (sequences ending at EOS or at T)."""
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], prob: float) -> None:
        law = laws[(group, prefix)]
        for y in range(VOCAB):
            p = prob * law[y]
            if y == EOS:
                out[(*prefix, -1)] = p
            elif len(prefix) + 1 == T:
                out[(*prefix, y)] = p
            else:
                walk((*prefix, y), p)

    walk((), 1.0)
    keys = sorted(out)
    return np.array([out[k] for k in keys])


@dataclass
class EngineAudit:
    """The audit of one neighbour: per step (every prefix of the changed group), for the whole
    output of that group (with the exact δ at the printed ε), and the other groups."""

    steps: AuditResult
    sequence: AuditResult
    others_identical: bool

    def within(self, g, clip: float) -> bool:
        return (self.steps.max_log_ratio <= 2 * clip / (B * TAU) + 1e-9
                and self.steps.rho_lower_bound <= g.rho / T + 1e-12
                and self.sequence.rho_lower_bound <= g.rho + 1e-12
                and self.sequence.delta_at_epsilon <= g.delta
                and self.others_identical)


def audit(d_laws: dict, n_laws: dict, changed_group: int, g) -> EngineAudit:
    prefixes = [k[1] for k in d_laws if k[0] == changed_group]
    steps = exact_audit(((d_laws[(changed_group, p)], n_laws[(changed_group, p)])
                         for p in prefixes), ALPHAS)
    p, q = sequence_law(d_laws, changed_group), sequence_law(n_laws, changed_group)
    sequence = exact_audit([(p, q)], ALPHAS, epsilon=g.epsilon)
    others = all(np.array_equal(d_laws[k], n_laws[k]) for k in d_laws if k[0] != changed_group)
    return EngineAudit(steps, sequence, others)


# --------------------------------------------------------------------------------- the audit


@pytest.mark.audits("invisibleink")
@pytest.mark.parametrize(("top_k", "sparse"), [(0, True), (2, True), (2, False)])
def test_engine_exact_audit_against_the_printed_guarantee(tmp_path, top_k, sparse):
    plan = _plan(tmp_path, REFERENCES, top_k, sparse, "d")
    g, clip = plan.guarantee, plan.params.clip
    assert g.mechanism == "invisibleink" and g.adjacency == "replace-by-null"
    assert g.rho == pytest.approx(T * clip**2 / (2 * B**2 * TAU**2), rel=1e-9)
    d_laws = step_laws(plan)
    assert len(d_laws) == G * sum((VOCAB - 1) ** t for t in range(T))
    seen_tight = 0.0
    for position in range(B):  # null each reference of group 0 in turn (the first included)
        refs = list(REFERENCES)
        refs[position] = ""
        neighbour = _plan(tmp_path, refs, top_k, sparse, f"n{position}")
        assert neighbour.guarantee == g and neighbour.jobs[1] == plan.jobs[1]
        result = audit(d_laws, step_laws(neighbour), 0, g)
        assert result.within(g, clip), result
        assert math.isfinite(result.steps.max_log_ratio)
        seen_tight = max(seen_tight, result.sequence.rho_lower_bound / g.rho)
    # the audit is not vacuous: the realised divergence is a sizeable part of the budget
    assert seen_tight > 0.2


class NoClipPolicy(InvisibleInkPolicy):
    """Broken twin: the private logits are averaged without clipping (sensitivity unbounded;
    the printed guarantee still assumes C/B)."""

    def scores(self, public, private, ids):
        ids = torch.arange(public.shape[-1]) if ids is None else ids
        pub = public[ids].to(torch.float64)
        diffs = private.to(torch.float64) - pub
        return ids.numpy(), (pub + diffs.sum(0) / self.batch_size).numpy()


class PrivateTopKPolicy(InvisibleInkPolicy):
    """Broken twin: V_k^+ also takes each reference's top-k tokens (spec §5 item 5)."""

    def candidates(self, public):
        return None  # ask the engine for dense private rows

    def scores(self, public, private, ids):
        mask = expanded_topk_mask(public, self.top_k, self.clip_norm, self.batch_size)
        for row in private:
            mask[torch.topk(row, self.top_k).indices] = True
        cand = torch.nonzero(mask).squeeze(-1)
        return cand.numpy(), candidate_scores(private[:, cand], public[cand], self.clip_norm,
                                              self.batch_size)


@pytest.mark.audits("invisibleink")
@pytest.mark.parametrize(("twin", "top_k"), [(NoClipPolicy, 0), (PrivateTopKPolicy, 2)])
def test_engine_audit_flags_broken_twins(tmp_path, twin, top_k):
    plan = _plan(tmp_path, REFERENCES, top_k, True, "d")
    g, clip = plan.guarantee, plan.params.clip

    def factory(_job):
        return twin(clip, B, TAU, top_k, VOCAB)

    d_laws = step_laws(plan, factory)
    flagged = []
    for position in range(B):
        refs = list(REFERENCES)
        refs[position] = ""
        neighbour = _plan(tmp_path, refs, top_k, True, f"n{position}")
        flagged.append(not audit(d_laws, step_laws(neighbour, factory), 0, g).within(g, clip))
    assert any(flagged)
