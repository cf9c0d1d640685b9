#!/usr/bin/env bash
# Run every benchmark on a quiet machine and regenerate RESULTS.md from their JSON.
# Usage: bash benchmarks/run_all.sh   (about 2 hours on 2 cores; the course alone is 1, the soak 10 min)
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=benchmarks/results
mkdir -p "$out"
for name in launch overhead fidelity model monitor sim widgets fabric faults soak shaping; do
  .venv/bin/clusterlab bench "$name" -o "$out/$name.json"
done
# Fidelity and overhead again, one after another: a figure must reproduce, and the report
# puts the runs of one bench side by side (NAME.json sorts before NAME.runK.json).
for run in 2 3; do
  .venv/bin/clusterlab bench fidelity -o "$out/fidelity.run$run.json"
done
.venv/bin/clusterlab bench overhead -o "$out/overhead.run2.json"
# Every notebook and solved lab: quiet, on one CPU with 2 GB, beside two busy processes.
.venv/bin/clusterlab bench course -o "$out/course.json"
{
  cat benchmarks/RESULTS.header.md
  .venv/bin/clusterlab bench report "$out"/*.json
} > benchmarks/RESULTS.md
