"""Defaults of ``dplang generate`` that its flags show, in a module that imports nothing
(``dplang generate --help`` reads them without loading the generation machinery)."""

#: Generations decoded at once (``--concurrent-groups``); speed only, never the output.
DEFAULT_CONCURRENT_GROUPS = 8
