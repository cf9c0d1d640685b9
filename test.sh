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
# Explorer widgets draw static figures under nbval (a kernel there has no front-end to
# show them), so what is compared is deterministic.
CLUSTERLAB_STATIC=1 .venv/bin/python -m pytest "$@"
