#!/usr/bin/env bash
# The prepared GPU check (docs/benchmarks.md, "GPU"): run from the repository root on a lent GPU
# machine, with its own PyTorch; at most ~8 minutes (the throughput part stops at --budget).
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec "${PYTHON:-python3}" scripts/gpu_check.py --device cuda --groups 1,8,64,256 --tokens 64 --budget 360 "$@"
