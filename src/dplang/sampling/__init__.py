"""dplang.sampling: differentially private sampling from distributions.

Implements Raskhodnikova, Sivakumar, Smith & Swanberg, "Differentially Private Sampling from
Distributions" (NeurIPS 2021; arXiv:2211.08193; ``docs/sampling.md``): given n i.i.d. records from
an unknown P, release ONE record whose law Q (over data and coins) is close to P in total variation,
under differential privacy with respect to replacing one record. Every sampler returns its samples
together with a :class:`~dplang.privacy.guarantees.Guarantee` fixed before the data is read.

k-ary distributions on {0, …, k−1}
    :class:`LaplaceHistogramSampler` (Thm 1.4; pure ε-DP, TV ≤ k/(εn)),
    :class:`DiscreteLaplaceHistogramSampler` (same with exact noise),
    :class:`RevealOrObscureSampler` (mixture baseline, exact law (1−q)P + qU).
Products on {0,1}^d
    :class:`ClippedMeanSampler` (Thm 1.8, biases in [1/3, 2/3]; ε is a function of n),
    :class:`BucketedProductSampler` (Thm 1.6, reconstructed; ρ-zCDP),
    :class:`PerCoordinateLaplaceSampler`, :class:`GaussianMarginalSampler` (baselines).
Baselines
    :class:`FirstRecordSampler` (non-private), :class:`RandomRecordSampler` ((0, 1/n)-DP),
    :class:`LearnThenSampleSampler`.
Several samples
    :func:`sample_repeated` (disjoint position blocks, parallel composition).
Evaluation
    :mod:`dplang.sampling.evaluation` (exact laws, TV, Monte Carlo, exact privacy audits),
    :mod:`dplang.sampling.bounds`, :mod:`dplang.sampling.distributions`.

Privacy contracts, stated once for the package: each sampler states its own in its class
docstring — the composition of the audited noise calls of :mod:`dplang.privacy.mechanisms` it
makes, then post-processing — and :mod:`dplang.sampling.release` states what ``dplang sample``
writes. Everything else here releases nothing and states no contract: the test distributions,
the bounds, the exact and Monte Carlo evaluation and audits (:mod:`.evaluation`,
:mod:`.lower_bounds`, :mod:`._histlaw`), the numerical helpers, and the parsing of public,
user-declared column types (:mod:`.tabular`). They compute from public quantities (a known P,
public parameters, a declared schema) or return values that are not releases.
"""

from .base import RepeatedSample, Sampler, SampleResult, block_slices, sample_repeated
from .baselines import FirstRecordSampler, LearnThenSampleSampler, RandomRecordSampler
from .kary import (
    DiscreteLaplaceHistogramSampler,
    KarySampler,
    LaplaceHistogramSampler,
    RevealOrObscureSampler,
    project_euclidean,
    project_l1,
)
from .product import (
    BucketedProductSampler,
    BucketPlan,
    ClippedMeanSampler,
    GaussianMarginalSampler,
    PerCoordinateLaplaceSampler,
    SparseBinaryRows,
)

__all__ = [
    "BucketPlan",
    "BucketedProductSampler",
    "ClippedMeanSampler",
    "DiscreteLaplaceHistogramSampler",
    "FirstRecordSampler",
    "GaussianMarginalSampler",
    "KarySampler",
    "LaplaceHistogramSampler",
    "LearnThenSampleSampler",
    "PerCoordinateLaplaceSampler",
    "RandomRecordSampler",
    "RepeatedSample",
    "RevealOrObscureSampler",
    "SampleResult",
    "Sampler",
    "SparseBinaryRows",
    "block_slices",
    "project_euclidean",
    "project_l1",
    "sample_repeated",
]
