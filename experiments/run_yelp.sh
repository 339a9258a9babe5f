#!/usr/bin/env bash
# The Yelp reproductions of docs/experiments.md, into runs/yelp (resumable: rerun to continue).
# MAUVE table first (public-only vs eps in {1,10} x B in {3,7}, k=50), then Table 12
# (k in {10,50,100} x eps in {1,3,5,10}, B=7); cells shared by the two are computed once.
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/yelp
.venv/bin/dplang experiment experiments/yelp_mauve.toml --out "$out"
mkdir -p "$out/final" && cp "$out"/results.md "$out/final/mauve_results.md"
cp "$out"/results.csv "$out/final/mauve_results.csv"
for f in utility_vs_epsilon utility_vs_compute; do cp "$out/$f.png" "$out/final/mauve_$f.png"; done
.venv/bin/dplang experiment experiments/yelp_table12.toml --out "$out"
cp "$out"/results.md "$out/final/table12_results.md"
cp "$out"/results.csv "$out/final/table12_results.csv"
cp "$out/effective_k_vs_epsilon.png" "$out/final/table12_effective_k_vs_epsilon.png"
