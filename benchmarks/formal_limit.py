"""Paper 001 (privacy in the limit): every experiment of dplang.formal at full size.

    .venv/bin/python benchmarks/formal_limit.py [--img docs/img] [--workers 2] [--quick]
        [--only limit:thmC.3 ...]

Runs limit:thm1.1 … limit:audit, prints each experiment's markdown table and its runtime, and
writes docs/img/formal_limit_*.png (quoted in docs/formal.md).
"""

from __future__ import annotations

from formal_statistical import main

if __name__ == "__main__":
    main("limit:")
