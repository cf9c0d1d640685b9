#!/usr/bin/env bash
# Run the whole test suite: lint, unit and multi-process tests, every notebook and every
# solved lab under nbval.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
# The browser tests drive Debian's chromium (no browser can be downloaded at test time). As
# root with apt (containers, CI) a missing one is installed; elsewhere those tests skip and
# say how to install it.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test.sh: chromium is missing; installing Debian's package for the browser tests" \
       "(apt-get update; apt-get install chromium)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
    || echo "test.sh: chromium could not be installed; the browser tests will be skipped" >&2
fi
.venv/bin/ruff check clusterlab tests benchmarks scripts
# Everything by default: the unit and multi-process tests, then every notebook and solved
# lab under nbval. Extra arguments go to pytest (e.g. ./test.sh -x -k cluster); paths
# replace the defaults.
paths=(tests notebooks solutions --nbval)
for arg in "$@"; do
  case "$arg" in -*) ;; *) paths=(); break ;; esac
done
# Explorer widgets draw static figures under nbval (a kernel there has no front-end to
# show them), so what is compared is deterministic. In solutions/, every check -- hidden
# ones included -- must pass: a failed check raises (LAB_STRICT).
CLUSTERLAB_STATIC=1 CLUSTERLAB_LAB_STRICT=1 CLUSTERLAB_LAB_HIDDEN=1 \
  .venv/bin/python -m pytest --durations=15 "${paths[@]}" "$@"
