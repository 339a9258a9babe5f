"""Free-text DP reports: the paper's baselines for proposal-and-filter (``docs/reports.md``).

A *free-text mechanism* releases natural language only — no certificate, no abstention — and
its sentences are turned into claims by a :class:`ClaimParser`, each scored with the same
support predicate as proposal-and-filter's candidates (paper §6: "we parse generated text into
asserted claims"). Implementations behind the :class:`FreeTextMechanism` interface:

* :class:`InvisibleInkReport` — "free-text DP (doc)": document-level DP generation of a report
  with InvisibleInk over the corpus, through dplang's public generation engine
  (:func:`dplang.textgen.methods.invisibleink.run_invisibleink`). Records (documents) are split into
  consecutive batches of B by position (data-independent); each batch yields one generated
  report text from a *report prompt* (the completion form below, for base models: the model
  continues "Summary of what customers commonly say in their reviews:"). Disjoint batches compose
  in parallel, every generation is charged for its T tokens.
* :class:`ExponentialSelectionReport` — a cheap stand-in for DP free text: the exponential
  mechanism picks r sentences from a public list of drafted report sentences, one after the
  other without replacement, each by its per-document vote count (support count), ε/r each;
  the chosen sentences are the report. (It reads the corpus through the same kind of predicate
  that scores it, so it is a *strong* free-text baseline.)
* :class:`PublicPromptReport` — "unfiltered LLM": the same model continues the public report
  prompt without any data (ε = 0).

Privacy contracts are stated on each class. All guarantees are with respect to **replacing one
record** (a document), as for proposal-and-filter, unless ``adjacency="replace-by-null"`` is
asked for: InvisibleInk's analysis is per replace-by-null neighbour (ρ-zCDP); a replace-one
neighbour is two replace-by-null steps, so by zCDP group privacy it costs 4ρ, and
:class:`InvisibleInkReport` calibrates to ρ/4 to offer the same ε under replace-one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..models.base import LogitsModel, reference_prefix
from ..privacy.accounting import epsilon_to_rho
from ..privacy.guarantees import Guarantee
from ..privacy.mechanisms import exponential_mechanism_probabilities
from ..privacy.randomness import RandomStreams
from ..textgen.engine import DecodingParams, GroupJob, run_plain
from ..textgen.methods.invisibleink import invisibleink_budget, run_invisibleink
from ..textgen.prompts import DEFAULT_MAX_REFERENCE_TOKENS, PromptTemplate
from .predicates import SupportPredicate, support_counts
from .statements import Statement

__all__ = [
    "REPORT_PROMPT",
    "ClaimParser",
    "ExponentialSelectionReport",
    "FreeTextMechanism",
    "FreeTextReport",
    "InvisibleInkReport",
    "PublicPromptReport",
    "score_claims",
]

#: The report prompt (completion form for base models). The private form shows one document and
#: asks for a summary of what customers *commonly* say; the public form asks the same with no
#: document, so an empty record contributes exactly the public logits (``docs/privacy.md``
#: invariant 1).
REPORT_PROMPT = PromptTemplate(
    name="report",
    private_text=("Customer review:\n{reference}\n\n"
                  "Summary of what customers commonly say in their reviews:\n"),
    public_text="Summary of what customers commonly say in their reviews:\n",
    form="completion",
)


@dataclass
class FreeTextReport:
    """What a free-text mechanism released: its texts and the guarantee they carry."""

    texts: list[str]
    guarantee: Guarantee
    details: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class FreeTextMechanism(Protocol):
    """A mechanism that writes a report as natural language only.

    Privacy contract for implementers: :meth:`guarantee` is fixed before the data is read (a
    function of n and the public parameters) and :meth:`generate` releases only texts covered
    by it."""

    name: str

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """The ex-ante guarantee of a release on a corpus of n records (the one signature of
        :class:`~dplang.privacy.guarantees.GuaranteeSource`)."""
        ...

    def generate(self, records: Sequence[str | None], seed: int | None = None
                 ) -> FreeTextReport:
        """Release report texts computed from ``records`` (one record = one document)."""
        ...


# --------------------------------------------------------------------------------------------
# Claim parsing


@dataclass(frozen=True)
class ClaimParser:
    """Sentences of a generated text as claims (sentence split, no LLM: a reconstruction, the
    paper does not say how it parses).

    The text is first cut where ``stop`` matches (a base model that starts a new prompt-like
    header, e.g. "Here is another ..." or "Customer review:"); it is then split at ., ! or ?
    followed by whitespace and at line breaks; bullets are stripped; a claim is a piece of at
    least ``min_words`` words that ends in ., ! or ? and is at most ``max_chars`` long. A text
    without any such sentence gives one claim (its first ``max_chars`` characters) when it has
    at least ``min_words`` words — an unfinished sentence is still asserted.

    Privacy contract: a function of the released text only (post-processing)."""

    min_words: int = 3
    max_chars: int = 300
    stop: str = r"\bHere is (a|another)\b|\bCustomer review:|\bSummary of what customers\b"

    def __call__(self, text: str) -> list[str]:
        match = re.search(self.stop, text) if self.stop else None
        if match:
            text = text[: match.start()]
        pieces = [" ".join(p.split()).lstrip("-*•0123456789.) ").strip()
                  for p in re.split(r"(?<=[.!?])\s+|\n+", text)]
        claims = [p for p in pieces if p.endswith((".", "!", "?"))
                  and len(p.split()) >= self.min_words and len(p) <= self.max_chars]
        if not claims and len(text.split()) >= self.min_words:
            claims = [" ".join(text.split())[: self.max_chars]]
        return claims


def score_claims(claims_per_text: Sequence[Sequence[str]], predicate: SupportPredicate,
                 records: Sequence[str | None]) -> list[np.ndarray]:
    """The exact support f = C/n of every parsed claim, grouped by text. PRIVATE: evaluation
    only (exact statistics of the corpus)."""
    flat = [Statement(c) for claims in claims_per_text for c in claims]
    n = max(len(records), 1)
    f = support_counts(predicate, flat, records) / n if flat else np.zeros(0)
    out, i = [], 0
    for claims in claims_per_text:
        out.append(np.asarray(f[i:i + len(claims)], dtype=np.float64))
        i += len(claims)
    return out


# --------------------------------------------------------------------------------------------
# InvisibleInk over the corpus (free-text DP, document level)


def _batches(n: int, batch_size: int, generations: int | None) -> list[range]:
    count = n // batch_size if generations is None else min(generations, n // batch_size)
    return [range(g * batch_size, (g + 1) * batch_size) for g in range(count)]


@dataclass
class InvisibleInkReport:
    """Free-text DP (doc): InvisibleInk generates report texts from batches of documents.

    Records are split by position into consecutive batches of ``batch_size`` (the first
    ``generations`` batches, or all ⌊n/B⌋); batch g yields one text with the report prompt,
    decoded by :func:`dplang.textgen.methods.invisibleink.run_invisibleink` with the clip
    norm calibrated to (ε, δ) for ``max_tokens`` tokens. Rows past the last full batch are not read.

    Privacy contract: (ε, δ)-DP (through ρ-zCDP and the tight conversion) with respect to
    replacing one record by any other (``adjacency="replace-one"``, default: calibrated at ρ/4
    under replace-by-null, zCDP group privacy for the two steps) or by the empty record
    (``"replace-by-null"``). Batches are disjoint and formed by position only (parallel
    composition); each generation is charged for ``max_tokens`` tokens whatever it emits; the
    candidate set of every step is computed from public logits only (the engine's contract).
    The seed is secret."""

    model: LogitsModel
    epsilon: float
    delta: float = 1e-5
    batch_size: int = 16
    max_tokens: int = 48
    temperature: float = 1.2
    top_k: int = 50
    generations: int | None = None
    adjacency: str = "replace-one"
    prompt: PromptTemplate = REPORT_PROMPT
    concurrent_groups: int = 8
    max_reference_tokens: int = DEFAULT_MAX_REFERENCE_TOKENS
    name: str = "free-text DP (doc): InvisibleInk"

    def __post_init__(self) -> None:
        if self.adjacency not in ("replace-one", "replace-by-null"):
            raise ValueError(f"adjacency must be replace-one or replace-by-null, "
                             f"got {self.adjacency}")
        if not self.epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {self.epsilon}")

    def _budget(self) -> dict[str, Any]:
        rho = epsilon_to_rho(self.epsilon, self.delta)
        if self.adjacency == "replace-one":
            rho = rho / 4.0  # replace-one = two replace-by-null steps: 2²ρ' = ρ
        return invisibleink_budget(epsilon=None, rho=rho, clip=None, delta=self.delta,
                                   tokens=self.max_tokens, batch_size=self.batch_size,
                                   temperature=self.temperature, adjacency="replace-by-null")

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        if n is None:
            raise ValueError("the report's guarantee needs n, the number of records")
        b = self._budget()
        rho = float(b["rho"]) * (4.0 if self.adjacency == "replace-one" else 1.0)
        return Guarantee.zcdp(
            "invisibleink-report", "record", self.adjacency, rho, self.delta,
            details={"clip": float(b["clip"]), "batch_size": self.batch_size,
                     "max_tokens": self.max_tokens, "temperature": self.temperature,
                     "top_k": self.top_k, "generations": len(_batches(n, self.batch_size,
                                                                       self.generations)),
                     "composition": "parallel over disjoint position batches"})

    def jobs(self, records: Sequence[str | None]) -> list[GroupJob]:
        """The generation groups: public prompt and one private prompt per record of the batch
        (an empty record is rendered as the public prompt)."""
        out = []
        for g, rows in enumerate(_batches(len(records), self.batch_size, self.generations)):
            public = self.model.render_prompt(self.prompt.render(None), self.prompt.system)
            private = []
            for i in rows:
                ref = records[i]
                if ref:
                    ref, _ = reference_prefix(self.model, ref, self.max_reference_tokens)
                private.append(self.model.render_prompt(self.prompt.render(ref),
                                                        self.prompt.system))
            out.append(GroupJob(g, public, tuple(private)))
        return out

    def generate(self, records: Sequence[str | None], seed: int | None = None
                 ) -> FreeTextReport:
        guarantee = self.guarantee(len(records))
        jobs = self.jobs(records)
        params = DecodingParams(float(guarantee.details["clip"]), self.batch_size,
                                self.temperature, self.top_k, self.max_tokens)
        streams = RandomStreams.from_os_entropy() if seed is None else RandomStreams(seed)
        results = run_invisibleink(self.model, jobs, params, streams, self.concurrent_groups)
        results.sort(key=lambda r: r.index)
        return FreeTextReport([r.text for r in results], guarantee,
                              {"tokens": [r.num_tokens for r in results]})


@dataclass
class PublicPromptReport:
    """Unfiltered LLM: the model continues the public report prompt, reading no record.

    Privacy contract: reads no record, so it is 0-DP (any adjacency)."""

    model: LogitsModel
    texts: int = 8
    max_tokens: int = 48
    temperature: float = 1.2
    top_k: int = 50
    prompt: PromptTemplate = REPORT_PROMPT
    name: str = "unfiltered LLM (no data)"

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return Guarantee.zcdp("public-prompt", "record", "replace-one", 0.0, 0.0)

    def generate(self, records: Sequence[str | None], seed: int | None = None
                 ) -> FreeTextReport:
        public = self.model.render_prompt(self.prompt.render(None), self.prompt.system)
        streams = RandomStreams.from_os_entropy() if seed is None else RandomStreams(seed)
        ids = run_plain(self.model, [public] * self.texts, self.max_tokens, self.temperature,
                        self.top_k, streams)
        return FreeTextReport([self.model.decode(x) for x in ids], self.guarantee(len(records)))


# --------------------------------------------------------------------------------------------
# DP selection among drafted sentences (the cheap stand-in for DP free text)


@dataclass
class ExponentialSelectionReport:
    """Free-text DP by selection: r sentences drawn one after another, without replacement,
    from a public list of drafted sentences, each with the exponential mechanism on its vote
    count C_s = Σ_r σ_s(r) (the support count under ``predicate``); the report is the chosen
    sentences, as text, with no certificate.

    Privacy contract: ε-DP under replace-one adjacency: each draw is (ε/r)-DP (utility C_s has
    sensitivity 1 per statement, P ∝ exp((ε/r)·C/2)), and the r draws compose sequentially.
    The list and the predicate are public and fixed before the data is read."""

    statements: Sequence[Statement | str]
    predicate: SupportPredicate
    epsilon: float
    sentences: int = 5
    name: str = "free-text DP (selection)"

    def __post_init__(self) -> None:
        if not 1 <= self.sentences <= len(self.statements):
            raise ValueError("need 1 <= sentences <= number of statements")
        if not self.epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {self.epsilon}")

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return Guarantee.pure("exponential-selection", "record", "replace-one", self.epsilon,
                              details={"sentences": self.sentences,
                                       "epsilon_per_draw": self.epsilon / self.sentences})

    def select(self, counts: np.ndarray, rng: np.random.Generator) -> list[int]:
        """The indices drawn given the vote counts (the mechanism's core; counts are private).
        """
        temperature = 2.0 * self.sentences / self.epsilon  # exp(ε' C/2), ε' = ε/r
        mask = np.ones(len(counts), dtype=bool)
        chosen = []
        for _ in range(self.sentences):
            probs = exponential_mechanism_probabilities(counts.astype(np.float64), temperature,
                                                        mask)
            j = int(rng.choice(len(counts), p=probs))
            chosen.append(j)
            mask[j] = False
        return chosen

    def ordered_law(self, counts: Sequence[int]) -> dict[tuple[int, ...], float]:
        """The exact law of the ordered tuple of drawn indices (for audits on small lists)."""
        counts = np.asarray(counts, dtype=np.float64)
        temperature = 2.0 * self.sentences / self.epsilon
        law: dict[tuple[int, ...], float] = {}

        def walk(prefix: tuple[int, ...], prob: float) -> None:
            if len(prefix) == self.sentences:
                law[prefix] = prob
                return
            mask = np.ones(counts.size, dtype=bool)
            mask[list(prefix)] = False
            probs = exponential_mechanism_probabilities(counts, temperature, mask)
            for j in np.flatnonzero(mask):
                walk((*prefix, int(j)), prob * float(probs[j]))

        walk((), 1.0)
        return law

    def generate(self, records: Sequence[str | None], seed: int | None = None
                 ) -> FreeTextReport:
        counts = support_counts(self.predicate, list(self.statements), records)
        streams = RandomStreams.from_os_entropy() if seed is None else RandomStreams(seed)
        chosen = self.select(counts, streams.generator(0))
        text = " ".join(_text(self.statements[j]) for j in chosen)
        return FreeTextReport([text], self.guarantee(len(records)), {"chosen": chosen})


def _text(s: Statement | str) -> str:
    return s.text if isinstance(s, Statement) else str(s)
