"""Course bench: every notebook and solved lab, run where learners run them.

Each notebook runs top to bottom in a fresh kernel (CLUSTERLAB_STATIC=1, as nbval runs it;
solved labs with every check, hidden ones included, as the grader runs them) under three
conditions, one after another:

* ``quiet``: the machine as it is; the reference for time.
* ``one_cpu``: the kernel and every process it starts pinned to one CPU, with 2 GB of memory
  for all of them: a Binder session's share. The pin is `sched_setaffinity`, inherited by
  children. The memory limit is a memory cgroup, made only where this process may (root, a
  writable cgroup v1 or v2 hierarchy); elsewhere the row says it was not enforced, and the
  peak is still measured and checked.
* ``busy``: every core, with two processes spinning beside the kernel: a laptop with a
  browser and an IDE open.

Each notebook runs in its own child process (`python -m clusterlab.bench.course`), which
confines itself before it starts the kernel, so the bench itself stays unpinned and outside
the cgroup. A row counts failed cells and the lines where a notebook said it could not show
a conclusion on this machine (`NOT_SHOWN`), the wall time and the peak memory (PSS of the
kernel and all its children).

Checks per condition: no failed cell; every notebook within 3x its quiet time; peak memory
within 1.5 GB. "Not shown" lines are reported, not failed: saying so plainly is what a
notebook should do when the machine cannot show a result.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from . import bench, check, details, result, tick

ROOT = Path(__file__).resolve().parents[2]
CONDITIONS = ("quiet", "one_cpu", "busy")
MEMORY_LIMIT = 2 * 2**30      # a Binder session's memory
MEMORY_TARGET_GB = 1.5        # what a notebook may use, all its processes together
SLOWDOWN_TARGET = 3.0         # time under a condition against the quiet run
NOTEBOOK_TIMEOUT_S = 900.0
# What a notebook prints when this machine cannot show a conclusion (common.conclude and
# the sections that skip a timing on a busy machine).
NOT_SHOWN = re.compile(r"Not shown on this run|^Skipped: |did not run in parallel")
QUICK = ("05_", "11_", "12_")  # the notebooks a busy machine broke before (issue 25)


def course_paths(*, quick: bool = False) -> list[Path]:
    """The notebooks, then the solved labs, in course order (`quick`: three notebooks)."""
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    if quick:
        return [p for p in notebooks if p.name.startswith(QUICK)]
    return notebooks + sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


# --- one notebook, in a child process --------------------------------------------------------

def _run_one(path: Path, *, cpus: list[int] | None, cgroup: str | None) -> dict:
    """Confine this process (children inherit), execute `path`, return its row."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    if cgroup:
        Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
    from ..labs.core import ENV_HIDDEN, ENV_STRICT
    from ..labs.grade import execute
    from ..widgets._common import STATIC_ENV

    os.environ.setdefault(STATIC_ENV, "1")
    if path.parent.name == "solutions":  # every check, hidden ones too, and a miss is an error
        os.environ.update({ENV_HIDDEN: "1", ENV_STRICT: "1"})

    r = execute(path, timeout=NOTEBOOK_TIMEOUT_S, allow_errors=True)
    not_shown = []
    for i, cell in enumerate(r.notebook.cells):
        for o in cell.get("outputs", []):
            text = o.get("text", "") if o.get("output_type") == "stream" else \
                o.get("data", {}).get("text/markdown", "")
            not_shown += [f"cell {i}: {line.strip()[:200]}" for line in text.splitlines()
                          if NOT_SHOWN.search(line)]
    return {"wall_s": round(r.seconds, 1), "peak_pss_gb": round(r.peak_bytes / 2**30, 3),
            "error": r.error, "cell_errors": r.cell_errors, "not_shown": not_shown}


def _child(path: Path, *, cpus: list[int] | None, cgroup: str | None) -> dict:
    """Run one notebook in a child process; a crash of the child is a row, not the bench's."""
    cmd = [sys.executable, "-m", "clusterlab.bench.course", str(path)]
    if cpus:
        cmd += ["--cpus", ",".join(map(str, cpus))]
    if cgroup:
        cmd += ["--cgroup", cgroup]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                           timeout=NOTEBOOK_TIMEOUT_S + 120)
    except subprocess.TimeoutExpired:
        return {"wall_s": None, "peak_pss_gb": None, "cell_errors": [], "not_shown": [],
                "error": f"the bench's child did not end within {NOTEBOOK_TIMEOUT_S + 120:g} s"}
    last = p.stdout.strip().splitlines()[-1:] or [""]
    try:
        return json.loads(last[0])
    except json.JSONDecodeError:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {"wall_s": None, "peak_pss_gb": None, "cell_errors": [], "not_shown": [],
                "error": f"the bench's child exited {p.returncode}: {tail}"}


# --- the conditions ---------------------------------------------------------------------------

def _memory_cgroup(limit: int) -> Path | None:
    """A new memory cgroup limited to `limit` bytes (v2, else v1), or None where this process
    may not make one. The caller removes it (`_remove_cgroup`)."""
    name = f"clusterlab-course-{os.getpid()}"
    own = _read(Path("/proc/self/cgroup")).splitlines()
    tries = []
    for line in own:
        _, controllers, rel = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":       # cgroup v2: memory.max, if memory is delegated here
            for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                parent = base / rel.lstrip("/")
                if "memory" in _read(parent / "cgroup.subtree_control").split():
                    tries.append((parent / name, "memory.max"))
        elif "memory" in controllers.split(","):
            tries.append((Path("/sys/fs/cgroup/memory") / rel.lstrip("/") / name,
                          "memory.limit_in_bytes"))
    for path, knob in tries:
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            (path / knob).write_text(str(limit))
        except OSError:
            _remove_cgroup(path)
            continue
        # no swap either, where the kernel offers the knob: a Binder pod has none
        swap = "memory.swap.max" if knob == "memory.max" else "memory.memsw.limit_in_bytes"
        with contextlib.suppress(OSError):
            (path / swap).write_text("0" if knob == "memory.max" else str(limit))
        return path
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _remove_cgroup(path: Path) -> None:
    """rmdir once its processes are gone (a killed kernel's children take a moment)."""
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def _oom_kills(path: Path) -> int:
    """How many times the kernel killed a process of this cgroup for memory."""
    for line in _read(path / "memory.events").splitlines():   # v2
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return int(_read(path / "memory.failcnt").strip() or 0)   # v1: hits of the limit


@contextlib.contextmanager
def _spinners(n: int):
    """`n` processes that spin on a core until the block ends: a busy laptop's load."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=10)


def run_course(paths: list[Path], *, conditions=CONDITIONS) -> dict:
    """Every path under every condition; the bench result with rows and checks."""
    rows = []
    one_cpu = sorted(os.sched_getaffinity(0))[:1]
    for cond in conditions:
        for path in paths:
            cgroup = None
            with contextlib.ExitStack() as here:
                if cond == "one_cpu":
                    cgroup = _memory_cgroup(MEMORY_LIMIT)
                    if cgroup is not None:
                        here.callback(_remove_cgroup, cgroup)
                if cond == "busy":
                    here.enter_context(_spinners(2))
                row = _child(path, cpus=one_cpu if cond == "one_cpu" else None,
                             cgroup=str(cgroup) if cgroup else None)
                if cond == "one_cpu":
                    row["memory_limit"] = ("2 GB (memory cgroup)" if cgroup else
                                           "not enforced: no writable memory cgroup here")
                    if cgroup:
                        row["oom_kills"] = _oom_kills(cgroup)
            rows.append({"condition": cond, "notebook": path.stem,
                         "kind": "solved lab" if path.parent.name == "solutions"
                         else "notebook", **row})
            tick()
    return result("course", rows, _checks(rows, conditions))


def _name(row: dict) -> str:
    """A row's notebook, told apart from a solved lab of the same name (07_gradient_scaling is
    both)."""
    return ("lab " if row.get("kind") == "solved lab" else "") + row["notebook"]


def _checks(rows: list[dict], conditions) -> list[dict]:
    quiet = {_name(r): r["wall_s"] for r in rows if r["condition"] == "quiet"}
    checks = []
    for cond in conditions:
        mine = [r for r in rows if r["condition"] == cond]
        failed = [f"{_name(r)}: {r['error'] or '; '.join(r['cell_errors'])}"
                  for r in mine if r["error"] or r["cell_errors"]]
        checks.append(check(f"{cond}: notebooks with a failed cell or no finish",
                            "0", len(failed) and failed, not failed))
        shown = [f"{_name(r)} {line}" for r in mine for line in r["not_shown"]]
        checks.append(check(f"{cond}: lines saying a conclusion was not shown here",
                            "reported, said plainly", len(shown), True))
        peak = max((r["peak_pss_gb"] or 0 for r in mine), default=0)
        checks.append(check(f"{cond}: largest peak memory, all processes (PSS, GB)",
                            f"<= {MEMORY_TARGET_GB}", peak, peak <= MEMORY_TARGET_GB))
        if cond != "quiet" and quiet:
            ratios = [r["wall_s"] / quiet[_name(r)] for r in mine
                      if r["wall_s"] and quiet.get(_name(r))]
            worst = round(max(ratios), 2) if ratios else None
            checks.append(check(f"{cond}: slowest notebook against its quiet run (x)",
                                f"<= {SLOWDOWN_TARGET:g}", worst,
                                worst is not None and worst <= SLOWDOWN_TARGET))
    return checks


@details("course")
def course_table(rows: list[dict]) -> list[str]:
    """One line per notebook: its time, peak memory, failures and "not shown" lines under
    each condition, beside the quiet run."""
    conds = [c for c in CONDITIONS if any(r["condition"] == c for r in rows)]
    by = {(r["condition"], _name(r)): r for r in rows}
    names = list(dict.fromkeys(_name(r) for r in rows))
    head = " | ".join(f"{c}: s, GB, failed, not shown" for c in conds)
    lines = [f"| notebook | {head} |", "| --- |" + " --- |" * len(conds)]
    for n in names:
        cells = []
        for c in conds:
            r = by.get((c, n))
            if r is None:
                cells.append("-")
                continue
            failed = len(r["cell_errors"]) + bool(r["error"])
            cells.append(f"{r['wall_s']}, {r['peak_pss_gb']}, "
                         f"{'**' + str(failed) + '**' if failed else 0}, {len(r['not_shown'])}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    limits = {r.get("memory_limit") for r in rows if r.get("memory_limit")}
    if limits:
        lines += ["", "one_cpu's memory limit: " + "; ".join(sorted(limits)) + "."]
    return lines


@bench("course")
def course(quick: bool = False) -> dict:
    """Every notebook and solved lab under each condition (`quick`: notebooks 05, 11, 12)."""
    return run_course(course_paths(quick=quick))


def _main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m clusterlab.bench.course",
                                 description="run one notebook as the course bench's child")
    ap.add_argument("notebook", type=Path)
    ap.add_argument("--cpus", help="comma-separated CPUs to pin to")
    ap.add_argument("--cgroup", help="a cgroup directory to join before the kernel starts")
    a = ap.parse_args(argv)
    cpus = [int(c) for c in a.cpus.split(",")] if a.cpus else None
    print(json.dumps(_run_one(a.notebook.resolve(), cpus=cpus, cgroup=a.cgroup)))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
