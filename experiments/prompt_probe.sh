#!/usr/bin/env bash
# Issue 35: does the README's own-data recipe give on-topic text? Three runs of the recipe on
# Yelp reviews (../shared/data/yelp/dev.csv, its first 1,400 rows as "my own data"), 200 texts
# each, InvisibleInk at eps = 3 with every default but the prompt (and --dtype bfloat16, to fit
# the CPU time): the bare generic prompt, the generic prompt with --describe, and a hand-written
# template. Each is scored against 200 held-out reviews (rows 4000-4199, cut to 64 tokens) with
# the classifier two-sample AUC and MAUVE (docs/generation.md, "Prompts", has the numbers).
#   experiments/prompt_probe.sh [OUT]        (resumable: rerun to continue)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/prompt_probe}"
data=../shared/data/yelp/dev.csv
dplang=.venv/bin/dplang
mkdir -p "$out"
"${PYTHON:-.venv/bin/python}" - "$data" "$out/heldout.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="", encoding="utf-8")))[4000:4200]
with open(sys.argv[2], "w", newline="", encoding="utf-8") as fh:
    w = csv.writer(fh); w.writerow(["text"]); w.writerows([[r["text"]] for r in rows])
PY
chmod 600 "$out/heldout.csv"
common=(--data "$data" --epsilon 3 --num 200 --dtype bfloat16 --dataset yelp-dev-prompt-probe -q)
"$dplang" generate "${common[@]}" --out "$out/generic.jsonl"
"$dplang" generate "${common[@]}" --describe "customer reviews of local businesses on Yelp" \
    --out "$out/described.jsonl"
"$dplang" generate "${common[@]}" --prompt experiments/prompts/yelp_review_hand.toml \
    --out "$out/hand.jsonl"
for run in generic described hand; do
  [ -f "$out/eval_$run/metrics.json" ] || "$dplang" evaluate --real "$out/heldout.csv" \
      --synthetic "$out/$run.jsonl" --metrics classifier,mauve,length --num 200 \
      --real-max-tokens 64 --out "$out/eval_$run" -q
done
