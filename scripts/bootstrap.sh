#!/usr/bin/env bash
# Create or reuse .venv and install dplang with the given extras (safe to run again).
# torch==2.13.0 is installed first: it is the CPU build on these machines, and any other
# version would pull several GB of CUDA packages.
set -euo pipefail
extras="${1:-}"
cd "$(dirname "$0")/.."
venv=.venv
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "dplang: creating $venv" >&2
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if ! "$venv/bin/python" -c 'import sys; from importlib.metadata import version; sys.exit(version("torch").split("+")[0] != "2.13.0")' 2>/dev/null; then
  echo "dplang: installing torch==2.13.0" >&2
  "${pip[@]}" install torch==2.13.0
fi
stamp="$venv/.dplang-installed-$(cat pyproject.toml | sha256sum | cut -c1-16)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
  echo "dplang: installing dplang[${extras}]" >&2
  spec="."
  [ -n "$extras" ] && spec=".[${extras}]"
  "${pip[@]}" install -e "$spec"
  touch "$stamp"
fi
