"""Defaults of ``dplang generate`` that its flags show, in a module that imports nothing
(``dplang generate --help`` reads them without loading the generation machinery)."""

#: Generations decoded at once (``--concurrent-groups``); speed only, never the output.
#: 16: on 2 CPU cores 1.11-1.21x the texts per second of 8 for about 1 GiB more memory; 32 adds
#: almost nothing (docs/benchmarks.md, "How many groups at once").
DEFAULT_CONCURRENT_GROUPS = 16
