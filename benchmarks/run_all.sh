#!/usr/bin/env bash
# Run every benchmark on a quiet machine and regenerate RESULTS.md from their JSON.
# Usage: bash benchmarks/run_all.sh   (about 20 minutes on 2 cores)
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=benchmarks/results
mkdir -p "$out"
for name in launch overhead fidelity model monitor sim widgets; do
  .venv/bin/clusterlab bench "$name" --json "$out/$name.json"
done
.venv/bin/python benchmarks/notebook_times.py
.venv/bin/python benchmarks/notebook_times.py --labs
{
  cat benchmarks/RESULTS.header.md
  args=()
  for f in "$out"/*.json; do args+=(--json "$f"); done
  .venv/bin/clusterlab bench report "${args[@]}"
} > benchmarks/RESULTS.md
