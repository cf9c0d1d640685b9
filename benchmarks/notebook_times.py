"""Execute every course notebook in a fresh kernel; record wall time and peak memory.

Memory is the peak, over 0.25 s samples, of the proportional set size (PSS) summed over the
kernel and all its children: forked ranks share pages copy-on-write, which a plain RSS sum
would count once per process. Writes benchmarks/results/notebooks.json in the bench format
(rows and checks), so `clusterlab bench report` can render it.

Usage: .venv/bin/python benchmarks/notebook_times.py [NOTEBOOK ...]
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S, MEMORY_BUDGET_GB = 90.0, 1.5


def _tree_pss(pid: int) -> int:
    total = 0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            info = p.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def run(path: Path) -> dict:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            km = client.km
            if km is not None and km.has_kernel and km.provisioner is not None:
                pid = getattr(km.provisioner, "pid", None) or km.provisioner.process.pid
                peak[0] = max(peak[0], _tree_pss(pid))
            done.wait(0.25)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    error = None
    try:
        client.execute()
    except Exception as exc:  # noqa: BLE001 - recorded as the row's outcome
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
    wall = time.monotonic() - t0
    done.set()
    watcher.join()
    return {"notebook": path.stem, "wall_s": round(wall, 1),
            "peak_pss_gb": round(peak[0] / 2**30, 3), "error": error}


def main(argv: list[str]) -> int:
    os.environ.setdefault("CLUSTERLAB_STATIC", "1")
    paths = [Path(a) for a in argv] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    rows = []
    for path in paths:
        row = run(path)
        rows.append(row)
        print(row, flush=True)
    checks = []
    for r in rows:
        checks.append({"name": f"{r['notebook']}: top to bottom in a fresh kernel",
                       "target": f"<= {BUDGET_S:g} s, no error", "measured": r["wall_s"],
                       "ok": r["error"] is None and r["wall_s"] <= BUDGET_S})
        checks.append({"name": f"{r['notebook']}: peak memory, all processes (PSS)",
                       "target": f"< {MEMORY_BUDGET_GB} GB", "measured": r["peak_pss_gb"],
                       "ok": r["peak_pss_gb"] < MEMORY_BUDGET_GB})
    sys.path.insert(0, str(ROOT))
    from clusterlab.doctor import machine

    out = ROOT / "benchmarks/results/notebooks.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": "notebooks", "machine": machine(), "rows": rows,
                               "checks": checks}, indent=1))
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
