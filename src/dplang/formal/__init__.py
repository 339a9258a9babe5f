"""dplang.formal: the formal-language lab (papers 000 and 001; docs/formal.md).

Differentially private identification and generation of languages, statistically (000, "On
the Price of Privacy for Language Identification and Generation") and in the limit (001,
"Differentially Private Language Generation and Identification in the Limit").

Modules, laid out like :mod:`dplang.sampling`:

* :mod:`~dplang.formal.universe` — ℕ₀ (with noise symbols), shortlex Σ*, Cantor ℕ², finite;
* :mod:`~dplang.formal.languages` — exact languages (eventually periodic sets, DFAs, columns in
  ℕ²) with counting, unranking and set algebra;
* :mod:`~dplang.formal.collections` — 1-indexed collections, closures, closure dimension, M(k),
  tell-tales, the families (Sperner, thresholds, rows, …);
* :mod:`~dplang.formal.distributions`, :mod:`~dplang.formal.streams` — the data models;
* :mod:`~dplang.formal.truth` — ground truth and the named instances;
* :mod:`~dplang.formal.statistical` — 000's Algorithms 1–7;
* :mod:`~dplang.formal.limit` — 001's algorithms and the fast-forward runner;
* :mod:`~dplang.formal.evaluation` — exact laws and errors, Monte Carlo, privacy audits;
* :mod:`~dplang.formal.bounds` — every theorem's bound (or the failed precondition);
* :mod:`~dplang.formal.experiments` — the experiments behind ``dplang formal reproduce``;
* :mod:`~dplang.formal.release` — ``--data`` runs as releases through :mod:`dplang.release`.

Privacy contract: the algorithms state theirs (a :class:`~dplang.privacy.guarantees.Guarantee`
per run); simulations on the public models are not releases and are not charged. Everything
else — universes, languages, collections, distributions and streams, ground truth, bounds,
exact evaluation and audits — releases nothing: it computes from public synthetic models and
known laws (the "Privacy contract: none" lines in those modules say this once more each).
"""
