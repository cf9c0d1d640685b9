#!/usr/bin/env bash
# Run the whole test suite: lint, unit and multi-process tests, and every notebook under nbval.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
.venv/bin/ruff check clusterlab tests benchmarks
if [ "$#" -eq 0 ]; then
  # Everything: the unit and multi-process tests, then every notebook under nbval.
  set -- tests notebooks --nbval
fi
.venv/bin/python -m pytest "$@"
