"""Copy the finished cells of the Yelp quality sweep into the repository, or restore them.

The sweep (``experiments/run_quality.sh``) runs for hours on a CPU, across sessions and
machines. After each stage this script copies what each *finished* cell produced into
``experiments/results/yelp_quality/`` (committed), so that another machine resumes from it:

    cells/<key>/gen.jsonl, gen.manifest.json   the release and its public manifest
    cells/<key>/metrics.json                   its evaluation against the held-out real texts
    cells/<key>/timing.json                    its generation time (wall clock and CPU)
    results.csv, results.md, *.png             the sweep's tables and plots

Nothing else is copied: no private side file (``.dplang-private/``), no copy of the data
(``data/``), no cell record holding the data's digest. The evaluation and timings are
statistics of rows of ``../shared/data/yelp/dev.csv``, a public benchmark, and the cells use
seeds written in the config (toy runs, not secret): on private data these files would be
private (``dplang.experiments.sweep``'s docstring says why) and must not be published.

``--restore`` does the reverse on a fresh checkout: it rebuilds each committed cell in
``--out`` (its record recomputed from the config and the data, as the sweep computes it), so
``dplang experiment`` skips the finished cells and generates only the rest:

    .venv/bin/python experiments/publish_quality.py --restore --out runs/yelp_quality
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "experiments" / "yelp_quality.toml"
RESULTS = ("results.csv", "results.md")


def finished_cells(out: Path) -> list[Path]:
    """Cell folders whose evaluation is written (the sweep's own "done" marker)."""
    return sorted(p for p in (out / "cells").glob("*") if (p / "eval" / "metrics.json").exists())


def publish(out: Path, to: Path) -> list[str]:
    """Copy every finished cell's public outputs and the sweep's results from ``out`` to
    ``to``; returns the keys of the cells copied."""
    keys = []
    for cell in finished_cells(out):
        dest = to / "cells" / cell.name
        dest.mkdir(parents=True, exist_ok=True)
        for src, name in ((cell / "gen.jsonl", "gen.jsonl"),
                          (cell / "gen.manifest.json", "gen.manifest.json"),
                          (cell / "eval" / "metrics.json", "metrics.json"),
                          (cell / "timing.json", "timing.json")):
            if src.exists():
                shutil.copyfile(src, dest / name)
                (dest / name).chmod(0o644)
        keys.append(cell.name)
    for name in [*RESULTS, *(p.name for p in out.glob("*.png"))]:
        if (out / name).exists():
            shutil.copyfile(out / name, to / name)
            (to / name).chmod(0o644)
    return keys


def restore(source: Path, out: Path) -> list[str]:
    """Rebuild the committed cells of ``source`` in the sweep folder ``out``."""
    sys.path.insert(0, str(ROOT / "src"))
    from dplang.experiments.config import load_config
    from dplang.experiments.sweep import CELL_SPEC, cell_spec
    from dplang.io import file_digest
    from dplang.release import write_json

    config = load_config(CONFIG)
    digest = file_digest(config.data_path)
    cells = {c.key: c for c in config.cells}
    keys = []
    for cell_src in sorted((source / "cells").glob("*")):
        cell = cells.get(cell_src.name)
        if cell is None or not (cell_src / "metrics.json").exists():
            continue
        dest = out / "cells" / cell.key
        if (dest / "eval" / "metrics.json").exists():
            continue  # already finished here
        (dest / "eval").mkdir(parents=True, exist_ok=True)
        out.chmod(0o700)
        for name in ("gen.jsonl", "gen.manifest.json", "timing.json"):
            if (cell_src / name).exists():
                shutil.copyfile(cell_src / name, dest / name)
        shutil.copyfile(cell_src / "metrics.json", dest / "eval" / "metrics.json")
        write_json(dest / CELL_SPEC, cell_spec(config, cell, digest), private=True)
        keys.append(cell.key)
    return keys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "yelp_quality",
                        help="the sweep's --out folder")
    parser.add_argument("--to", type=Path, default=ROOT / "experiments" / "results"
                        / "yelp_quality", help="where the committed results live")
    parser.add_argument("--restore", action="store_true",
                        help="rebuild the committed cells in --out instead of copying out")
    args = parser.parse_args()
    if args.restore:
        keys = restore(args.to, args.out)
        print(f"restored {len(keys)} cell(s) into {args.out}: {', '.join(keys) or 'none'}")
    else:
        keys = publish(args.out, args.to)
        print(f"published {len(keys)} finished cell(s) to {args.to}: {', '.join(keys) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
