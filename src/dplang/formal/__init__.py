"""dplang.formal: the formal-language lab (specs 000 and 001).

Differentially private identification and generation of languages, statistically (000, "the
price of privacy") and in the limit (001). See docs/formal.md.

Modules: :mod:`~dplang.formal.universe`, :mod:`~dplang.formal.languages`,
:mod:`~dplang.formal.collections`, :mod:`~dplang.formal.distributions`,
:mod:`~dplang.formal.streams`, :mod:`~dplang.formal.truth`.
"""
