#!/usr/bin/env bash
# The prepared GPU check (docs/benchmarks.md, "GPU"): run from the repository root on a lent GPU
# machine, with its own PyTorch; at most ~8 minutes (the throughput part stops at --budget).
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec "${PYTHON:-python3}" scripts/gpu_check.py --device cuda --groups 64,256,1024 --tokens 64 \
    --arch default,llama3.2-1b --budget 360 --long 256:512 "$@"
