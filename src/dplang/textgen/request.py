"""The request of one private generation run: every flag of ``dplang generate`` (all of it
public except the data), read by orchestration (:mod:`dplang.textgen.orchestration`), the resume
rules (:mod:`dplang.textgen.resume`), the API, the CLI and the sweeps.

A module of its own so that the modules that read a request need not import the run that
executes it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .defaults import DEFAULT_CONCURRENT_GROUPS
from .prompts import DEFAULT_MAX_REFERENCE_TOKENS, DEFAULT_TEMPLATE

__all__ = ["GenerationRequest"]


@dataclass(frozen=True)
class GenerationRequest:
    """Everything a ``dplang generate`` run needs (all of it public except the data)."""

    data: Path
    out: Path
    batch_size: int
    max_tokens: int
    temperature: float
    top_k: int
    epsilon: float | None = None
    delta: float = 1e-6
    rho: float | None = None
    clip: float | None = None
    adjacency: str = "replace-by-null"
    num: int | None = None
    seed: int | None = field(default=None, repr=False)  # secret
    concurrent_groups: int = DEFAULT_CONCURRENT_GROUPS
    prompt: str = DEFAULT_TEMPLATE
    system: str | None = None
    #: ``--allow-special-tokens``: let the model sample its special and control tokens
    #: (``<start_of_image>``...), which are otherwise never sampled.
    special_tokens: bool = False
    #: ``--describe``: a PUBLIC phrase saying what the texts are ("restaurant reviews from
    #: Yelp"), written into both prompts of the generic template (and into the manifest).
    describe: str | None = None
    text_column: str = "text"
    group_by: tuple[str, ...] = ()
    #: How grouped batches are listed, hence which the first ``num`` are: ``"grouped"``
    #: (group by group, the default) or ``"interleaved"`` (every group in proportion;
    #: :func:`~dplang.textgen.batching.make_batches`). Public: positions and labels only.
    batch_order: str = "grouped"
    model: str = "default"
    max_reference_tokens: int = DEFAULT_MAX_REFERENCE_TOKENS
    sparse_head: bool = True
    #: Compute dtype of the model body (a TransformersModel option; logits stay float32).
    dtype: str = "bfloat16"
    ledger: str | Path | None = field(default=None, repr=False)  # may hold a password
    #: Ledger name of the dataset (default: the data file's resolved path).
    dataset: str | None = None
    method: str = "invisibleink"
    #: The method's own options by name (``{"sigma": 0.3}`` for ``--amin-sigma 0.3``); those
    #: not given take the defaults of the method's :class:`~dplang.textgen.methods.MethodSpec`.
    method_options: Mapping[str, Any] = field(default_factory=dict)
    #: Replace what ``out`` holds (another run, or a stale private side file) with a new run.
    #: The old files are removed only once the new release has been charged.
    overwrite: bool = False
    #: With ``overwrite``: only continue the run kept as this release (stopped before its
    #: first text, with its seed), and refuse — rather than start a new run, a new charge —
    #: when the run that matches the request is another. A sweep sets it when it continues a
    #: cell's interrupted replacement on its own. Private (a release id hashes the seed).
    continue_release: str | None = None
    #: The seed is public (written in a configuration file): a *toy run*, whose guarantee is
    #: void; it is labelled so in the public manifest and the ledger (``Guarantee.public_seed``).
    public_seed: bool = False
    #: Audits only (a toy run): draw the noise from streams rooted at (seed, this key) instead
    #: of (seed, release id), so that runs on neighbouring datasets sharing seed and key are
    #: coupled (:attr:`dplang.release.Release.coupling`).
    coupling: str | None = None
    #: The release's public time (the manifest's ``started``, the public files' times) when
    #: not the moment it is opened: a sweep gives every cell the sweep's start, since one
    #: cell's time minus the one before it would show how long that cell's generation and
    #: evaluation on private rows took (:mod:`dplang.experiments.sweep`).
    opened: float | None = None
    #: The file ``data`` was copied from (an experiment's data file, whose rows it copies):
    #: the ledger's check that the file has a budget this release does not see looks at it.
    data_source: Path | None = None
    #: SHA-256 of :attr:`data_source`, the content the ledger records for this release
    #: (computed when not given; a sweep gives the one its copy was made from). Private:
    #: never fingerprinted.
    data_source_digest: str | None = None
