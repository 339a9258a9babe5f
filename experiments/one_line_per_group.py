"""Rewrite a sweep cell's generations with one line per group, in group order.

dplang before 61c550c (the quality sweep's frozen code, 98e648b) reran a population method
(Aug-PE) whole when its cell was resumed and appended the rerun to what the first attempt had
written: the same records again (a population run is a function of its secret seed and the
data), so the file held some groups twice. The evaluator of that code took the first n lines in
group order and so counted some texts twice and left other groups out. This script keeps each
group's first line, refuses a group whose lines differ, keeps the file's times (its
modification time is the release's start, not the time of this repair) and sets the public
manifest's ``generations_written`` to the number of groups. Then re-evaluate the cell. Through
the frozen sweep (delete the cell's ``eval/metrics.json`` and run it again) its resume of the
finished cell rewrites the public manifest without the population method's released
statistics: keep a copy of the manifest and put it back afterwards (docs/experiments.md, "A
correction").

    .venv/bin/python experiments/one_line_per_group.py runs/yelp_quality/cells/CELL/gen.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dplang.release import write_atomic, write_json


def one_line_per_group(path: Path) -> tuple[int, int]:
    """Rewrite ``path``; returns (lines before, lines after)."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    first: dict[int, str] = {}
    for line in lines:
        group = int(json.loads(line)["group"])
        if group in first and json.loads(first[group]) != json.loads(line):
            raise SystemExit(f"{path}: group {group} is on several lines with different records")
        first.setdefault(group, line)
    # written as dplang writes a release: atomically, with the file's own (public) time
    write_atomic(path, "".join(first[g] + "\n" for g in sorted(first)),
                 times=path.stat().st_mtime)
    manifest = path.with_name(path.stem + ".manifest.json")
    if manifest.is_file():
        data = json.loads(manifest.read_text(encoding="utf-8"))
        if "generations_written" in data:
            data["generations_written"] = len(first)
            write_json(manifest, data, times=manifest.stat().st_mtime)
    return len(lines), len(first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    for path in ap.parse_args().files:
        before, after = one_line_per_group(path)
        print(f"{path}: {before} lines -> {after} (one per group)", file=sys.stderr)


if __name__ == "__main__":
    main()
