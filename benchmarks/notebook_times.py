"""Execute every course notebook (or solved lab) in a fresh kernel; record wall time and
peak memory.

Memory is the peak, over 0.25 s samples, of the proportional set size (PSS) summed over the
kernel and all its children: forked ranks share pages copy-on-write, which a plain RSS sum
would count once per process. Writes benchmarks/results/notebooks.json (or labs.json with
--labs) in the bench format (rows and checks), so `clusterlab bench report` can render it.

Solved labs run as the grader runs them: every check, hidden ones included (and strict, so a
failed check is an error in the row).

Usage: .venv/bin/python benchmarks/notebook_times.py [--labs] [NOTEBOOK ...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clusterlab.labs.grade import execute  # noqa: E402 - after the path set-up

BUDGET_S, MEMORY_BUDGET_GB = 90.0, 1.5


def run(path: Path) -> dict:
    r = execute(path, timeout=600, allow_errors=False)
    error = r.error or (r.cell_errors[0] if r.cell_errors else None)
    return {"notebook": path.stem, "wall_s": round(r.seconds, 1),
            "peak_pss_gb": round(r.peak_bytes / 2**30, 3), "error": error}


def main(argv: list[str]) -> int:
    labs = "--labs" in argv
    argv = [a for a in argv if a != "--labs"]
    os.environ.setdefault("CLUSTERLAB_STATIC", "1")
    if labs:
        os.environ.update(CLUSTERLAB_LAB_HIDDEN="1", CLUSTERLAB_LAB_STRICT="1")
    folder = ROOT / ("solutions" if labs else "notebooks")
    paths = [Path(a) for a in argv] or sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    rows = []
    for path in paths:
        row = run(path)
        rows.append(row)
        print(row, flush=True)
    checks = []
    kind = "solved lab, every check incl. hidden" if labs else "top to bottom"
    for r in rows:
        checks.append({"name": f"{r['notebook']}: {kind}, in a fresh kernel",
                       "target": f"<= {BUDGET_S:g} s, no error", "measured": r["wall_s"],
                       "ok": r["error"] is None and r["wall_s"] <= BUDGET_S})
        checks.append({"name": f"{r['notebook']}: peak memory, all processes (PSS)",
                       "target": f"< {MEMORY_BUDGET_GB} GB", "measured": r["peak_pss_gb"],
                       "ok": r["peak_pss_gb"] < MEMORY_BUDGET_GB})
    from clusterlab.doctor import machine

    name = "labs" if labs else "notebooks"
    out = ROOT / f"benchmarks/results/{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": name, "machine": machine(), "rows": rows,
                               "checks": checks}, indent=1))
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
