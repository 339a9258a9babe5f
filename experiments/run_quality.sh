#!/usr/bin/env bash
# Issue 37's quality sweep in the order that makes its verdicts decidable earliest: the public
# cell, then the nonprivate ceiling and InvisibleInk at eps = 10 (B = 7), then the cheaper
# cells (nonprivate B = 1 and 3, Amin, AdaPMixED: yelp_quality_second.toml), then the rest of
# experiments/yelp_quality.toml (which skips the cells already made: same keys, same settings).
# Resumable: run it again to continue. After each stage the finished cells' public outputs are
# copied to experiments/results/yelp_quality/ (experiments/publish_quality.py).
#   OUT=runs/yelp_quality DPLANG=".venv/bin/dplang" nice -n 19 experiments/run_quality.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-runs/yelp_quality}"
read -r -a dplang <<< "${DPLANG:-.venv/bin/dplang}"
python="${PYTHON:-.venv/bin/python}"
for config in yelp_quality_public yelp_quality_first yelp_quality_second yelp_quality; do
  "${dplang[@]}" experiment "experiments/$config.toml" --out "$out"
  "$python" experiments/publish_quality.py --out "$out" --to experiments/results/yelp_quality
done
