"""`clusterlab grade PATH...`: execute submitted lab notebooks and tabulate their points.

Each notebook runs in a fresh kernel with a wall-clock limit, with every hidden check
switched on and a seed of the grader's choosing. Every `check()` it calls appends its
outcomes to a log that the grader reads back, so points come from the checks that actually
ran (and from `clusterlab.labs`' registry, never from the notebook's own metadata). A
notebook that crashes, hangs or is not a lab gets a row that says so; the grader itself
goes on to the next one, and leaves no kernel or rank behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import multiprocessing
import os
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import psutil

from . import all_labs
from .build import lab_id_of
from .core import DEFAULT_SEED, ENV_HIDDEN, ENV_LOG, ENV_SEED, ENV_STRICT, temp_env

DEFAULT_TIMEOUT = 300.0


@dataclasses.dataclass
class Execution:
    seconds: float
    peak_bytes: int  # peak PSS of the kernel and all its children (forked ranks share pages)
    error: str  # "" when every cell ran; else what stopped it (timeout, dead kernel)
    cell_errors: list[str]
    notebook: object = None  # the executed notebook (nbformat), outputs and all


def tree_pss(pid: int) -> int:
    """Proportional set size of a process and its descendants (shared pages counted once)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            info = p.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def execute(path: Path, *, timeout: float, allow_errors: bool = True) -> Execution:
    """Run a notebook top to bottom in a fresh kernel; its cells get `timeout` seconds in
    all. The clock starts at the first cell, not at launch: a kernel's start is the
    machine's cost, not the learner's (on a busy machine it took a good part of a 15 s
    budget), and has its own limit (`startup_timeout`)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    deadline: list[float] = []

    def remaining(_cell) -> int:
        if not deadline:
            deadline.append(time.monotonic() + timeout)
        return max(1, int(deadline[0] - time.monotonic()))

    client = NotebookClient(
        nb, kernel_name="python3", allow_errors=allow_errors, startup_timeout=60,
        timeout_func=remaining, resources={"metadata": {"path": str(path.parent)}})
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            km = client.km
            pid = None
            if km is not None and km.has_kernel and km.provisioner is not None:
                pid = getattr(km.provisioner, "pid", None)
            if pid:
                peak[0] = max(peak[0], tree_pss(pid))
            done.wait(0.25)

    watcher = threading.Thread(target=sample, daemon=True)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    watcher.start()
    t0 = time.monotonic()
    error = ""
    try:
        client.execute()
    except CellTimeoutError:
        error = f"timed out: the notebook did not finish within {timeout:g} s"
    except DeadKernelError:
        error = "the kernel died (a crash, os._exit, or too much memory)"
    except Exception as exc:  # noqa: BLE001 - any failure of one notebook is a row, not a crash
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
    finally:
        done.set()
        watcher.join(1)
        _kill_new_children(before)
    cell_errors = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                cell_errors.append(f"cell {i}: {out.get('ename')}: {out.get('evalue', '')[:160]}")
    return Execution(time.monotonic() - t0, peak[0], error, cell_errors, nb)


def _kill_new_children(before: set[int]) -> None:
    """Whatever the notebook started and its kernel's shutdown did not end: end it now."""
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        left = [p for p in psutil.Process().children(recursive=True)
                if p.pid not in before and p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
        if not left:
            return
        time.sleep(0.1)
    for p in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def _learner_names(paths: list[Path]) -> dict[Path, str]:
    """A room's submissions usually live in one folder per learner: name rows after the
    folder; when every notebook sits in the same folder, after the file."""
    parents = {p.parent.resolve() for p in paths}
    return {p: (p.stem if len(parents) == 1 else p.parent.name) for p in paths}


def collect(paths: list[str | Path]) -> list[Path]:
    """Notebook files named, or found under named folders (checkpoints skipped)."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found += sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
        elif p.exists():
            found.append(p)
        else:
            raise FileNotFoundError(f"no such file or folder: {raw}")
    return found


def grade_one(path: Path, learner: str, *, timeout: float, seed: int) -> dict:
    row = {"path": str(path), "learner": learner, "lab": None, "status": "", "note": "",
           "checks": [], "earned": 0, "possible": 0, "seconds": 0.0, "peak_mb": 0.0}
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001
        row.update(status="unreadable", note=f"not a notebook: {str(exc).splitlines()[0][:160]}")
        return row
    lab_id = lab_id_of(nb)
    labs = all_labs()
    if lab_id is None:
        row.update(status="not a lab", note="no clusterlab.lab in its metadata: not a lab notebook")
        return row
    if lab_id not in labs:
        row.update(status="not a lab", note=f"names lab {lab_id!r}, which does not exist")
        return row
    row["lab"] = lab_id
    # Named after this process: if the grader is killed, the next cluster's start sweeps it.
    fd, log = tempfile.mkstemp(prefix=f"clusterlab-{os.getpid()}-grade-", suffix=".jsonl")
    os.close(fd)
    try:
        with temp_env(**{ENV_LOG: log, ENV_HIDDEN: "1", ENV_SEED: str(seed), ENV_STRICT: "0",
                         "NBGRADER_EXECUTION": None}):
            run = execute(path, timeout=timeout)
        with open(log) as f:
            logged = [json.loads(line) for line in f if line.strip()]
    finally:
        os.unlink(log)
    ran = {(o["exercise"], o["check"]): o for o in logged}  # the last run of a check counts
    why_missing = run.error or (run.cell_errors[0] if run.cell_errors else "")
    for ex, c in labs[lab_id].checks:
        o = ran.get((ex.id, c.name))
        if o is None or o["status"] == "skip":
            status = "not run"
            message = ("its check() cell did not run" + (f" - {why_missing}" if why_missing
                                                         else " (was it deleted?)"))
        else:
            status, message = o["status"], o["message"]
        earned = c.points if status == "pass" else 0
        row["checks"].append({"exercise": ex.id, "check": c.name, "hidden": c.hidden,
                              "points": c.points, "earned": earned, "status": status,
                              "message": message})
    row["earned"] = sum(c["earned"] for c in row["checks"])
    row["possible"] = sum(c["points"] for c in row["checks"])
    row["seconds"] = round(run.seconds, 1)
    row["peak_mb"] = round(run.peak_bytes / 2**20, 1)
    if run.error:
        row.update(status="crashed" if "died" in run.error else "timed out", note=run.error)
    else:
        row["status"] = "graded"
        if run.cell_errors:
            row["note"] = f"{len(run.cell_errors)} cell(s) raised; first: {run.cell_errors[0]}"
    return row


def grade(paths: list[str | Path], *, timeout: float = DEFAULT_TIMEOUT,
          seed: int = DEFAULT_SEED, jobs: int = 1, progress=None) -> list[dict]:
    """Grade every notebook; one row per notebook, in the order of `collect`.

    `jobs` > 1 grades that many notebooks at once, each in its own worker process (a
    notebook's environment and leftover-process sweep are per process). Labs that time
    real clusters share the machine's cores then: give a laptop 1, a many-core host more."""
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1, got {jobs!r}")
    files = collect(paths)
    if not files:
        raise ValueError("no notebooks to grade in: " + " ".join(map(str, paths)))
    names = _learner_names(files)
    if jobs == 1:
        rows = []
        for path in files:
            if progress:
                progress(f"grading {path} ...")
            rows.append(grade_one(path, names[path], timeout=timeout, seed=seed))
        return rows
    # fork: workers inherit the lab registry, including labs registered by the caller.
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(files)),
                                                mp_context=context) as pool:
        futures = {pool.submit(grade_one, path, names[path], timeout=timeout, seed=seed): path
                   for path in files}
        try:
            for done in concurrent.futures.as_completed(futures):
                if progress:
                    progress(f"graded {futures[done]}")
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        return [future.result() for future in futures]


def all_passed(rows: list[dict]) -> bool:
    return bool(rows) and all(
        r["status"] == "graded" and r["checks"] and all(c["status"] == "pass"
                                                        for c in r["checks"])
        for r in rows)


def table(rows: list[dict]) -> str:
    """Per lab: one line per learner, one column per check (points earned), a total;
    then why each lost point was lost; then the notebooks that could not be graded."""
    out: list[str] = []
    labs = all_labs()
    for lab_id in sorted({r["lab"] for r in rows if r["lab"]}):
        lab_rows = [r for r in rows if r["lab"] == lab_id]
        checks = labs[lab_id].checks
        out.append(f"{lab_id}: {labs[lab_id].title} ({labs[lab_id].points} points)")
        width = max(8, *(len(r["learner"]) for r in lab_rows))
        cols = [f"c{i + 1}" for i in range(len(checks))]
        out.append("  " + "learner".ljust(width) + " " + " ".join(c.rjust(3) for c in cols)
                   + "   total   time  status")
        for r in lab_rows:
            cells = []
            for c in r["checks"]:
                cell = str(c["earned"]) if c["status"] in ("pass", "fail") else "-"
                cells.append(cell.rjust(3))
            total = f"{r['earned']}/{r['possible']}"
            out.append(f"  {r['learner'].ljust(width)} {' '.join(cells)}   {total:>5}"
                       f" {r['seconds']:5.0f} s  {r['status']}")
        out.append("  checks:")
        for i, (ex, c) in enumerate(checks):
            tag = ", hidden" if c.hidden else ""
            out.append(f"    c{i + 1} {ex.id}: {c.name} ({c.points} pt{tag})")
        lost = [(r, c) for r in lab_rows for c in r["checks"] if c["status"] != "pass"]
        if lost:  # one line per learner and reason: ten unwritten checks are one line
            out.append("  why points were lost:")
            reasons: dict[tuple[str, str, str], list[str]] = {}
            for r, c in lost:
                i = next(k for k, (ex, ch) in enumerate(checks)
                         if ex.id == c["exercise"] and ch.name == c["check"])
                key = (r["learner"], c["status"], c["message"])
                reasons.setdefault(key, []).append(f"c{i + 1}")
            for (learner, status, message), cols in reasons.items():
                out.append(f"    {learner} {','.join(cols)} [{status}]: {message}")
        for r in lab_rows:
            if r["note"]:
                out.append(f"  note for {r['learner']}: {r['note']}")
        out.append("")
    others = [r for r in rows if not r["lab"]]
    if others:
        out.append("not graded:")
        for r in others:
            out.append(f"  {r['path']}: {r['note']}")
        out.append("")
    n_ok = sum(1 for r in rows if r["lab"] and r["status"] == "graded"
               and all(c["status"] == "pass" for c in r["checks"]))
    out.append(f"{n_ok} of {len(rows)} notebook(s) passed every check")
    return "\n".join(out)
