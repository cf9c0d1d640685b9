#!/usr/bin/env bash
# Start the course: set up whatever is missing, then open JupyterLab on the notebooks.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
exec .venv/bin/jupyter lab --notebook-dir=notebooks "$@"
