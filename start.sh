#!/usr/bin/env bash
# Start the course: set up whatever is missing, then open JupyterLab at the repository root
# (notebooks/, labs/ and solutions/ side by side) on notebooks/00_start_here.ipynb.
# The server listens on loopback only and asks for its token; extra arguments go to
# `jupyter lab` (e.g. ./start.sh --no-browser --port 8899).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
args=(--ServerApp.ip=127.0.0.1 --ServerApp.root_dir="$PWD"
      --LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb)
# JupyterLab refuses to run as root (as in containers, CI and many VMs) unless told to;
# loopback plus a token keeps that safe.
if [ "$(id -u)" = 0 ]; then args+=(--allow-root); fi
exec .venv/bin/jupyter lab "${args[@]}" "$@"
