#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv with the pinned
# requirements, then install clusterlab itself in editable mode. Idempotent: it does
# nothing when the requirements have not changed since the last run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "clusterlab needs Python 3.11 or newer (found: $("$PY" --version 2>&1))" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.clusterlab-installed
want=$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "Setting up .venv (first run only; torch is the CPU build)..."
  # torch first, as the CPU build (PyTorch's CPU index on Linux, where PyPI's is the CUDA
  # build); the pin below it is then already satisfied.
  .venv/bin/python scripts/install_torch.py
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
  echo "$want" > "$stamp"
fi
