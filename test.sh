#!/usr/bin/env bash
# Run the whole test suite: lint, unit and multi-process tests, and every notebook under nbval.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
.venv/bin/ruff check clusterlab tests benchmarks
.venv/bin/python -m pytest "$@"
