"""`clusterlab grade PATH...`: execute submitted lab notebooks and tabulate their points.

Nothing the learner's kernel says is taken as a grade. For each notebook the grader

1. copies it (and the plain files beside it, no other notebook) into a private folder;
2. executes it there in a fresh kernel with a wall-clock limit (`worker.py run`), with no
   seed, no hidden-check switch and no log to write to: `check()` cells only say that the
   grader runs the checks; then asks the kernel for the objects the lab's checks need;
3. runs every check of the lab, hidden ones included, itself, in a new process the notebook
   never ran in (`worker.py check`), on those objects, with a seed the kernel never saw (a
   fresh secret one per grading run unless `--seed` is given); the outcomes come back on
   that process's own stdout; points come from `clusterlab.labs`' registry.

Both steps run in a sandbox (sandbox.py: namespaces, a user id of its own, no network, the
rest read-only, limits) where the machine allows it; where it does not, each row says that
it was not isolated. A notebook that crashes, hangs or is not a lab gets a row that says so;
the grader goes on to the next one and leaves no process behind.

What is still trusted: the learner's functions run inside the checking process when a check
calls them, as they must, so a function written to attack the checks (not a cell that
writes a log line or sets a variable) can still tamper with that process; the sandbox keeps
that from reaching anything outside it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import psutil

from . import all_labs, sandbox, worker
from .build import lab_id_of
from .sandbox import Limits

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


STATUSES = ("graded", "timed out", "crashed", "not a lab", "unreadable", "grader error")
GRADER_ERROR = "grader error"  # the grader, not the submission, failed: exit code 2
_LAB_ENV = ("CLUSTERLAB_LAB_HIDDEN", "CLUSTERLAB_LAB_SEED", "CLUSTERLAB_LAB_STRICT",
            "CLUSTERLAB_GRADE_LOG")
_PASSED_ENV = ("PATH", "LANG", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS")
WORKER = str(Path(__file__).with_name("worker.py"))
KERNEL_START_S, MARGIN_S = 60.0, 30.0


@dataclasses.dataclass(frozen=True)
class Isolation:
    """How submissions run: in a sandbox (method "unshare"), or not isolated ("none", why)."""
    method: str
    why: str = ""
    limits: Limits = Limits()

    @classmethod
    def detect(cls, *, wanted: bool = True, limits: Limits | None = None) -> Isolation:
        limits = limits or Limits()
        if not wanted:
            return cls("none", "isolation was switched off (--no-sandbox)", limits)
        method, why = sandbox.probe()
        return cls(method, why, limits)

    @property
    def label(self) -> str:
        return "sandbox" if self.method != "none" else f"NOT ISOLATED: {self.why}"


def new_seed() -> int:
    """A fresh secret seed for one grading run (the kernel never sees it)."""
    return secrets.randbelow(2**31 - 1) + 1


def _commit() -> str | None:
    """The git revision of the clusterlab checkout the checks come from (+"-dirty"), if any."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_info(*, seed: int, seed_given: bool, timeout: float, jobs: int,
             isolation: Isolation) -> dict:
    """What a grade depends on besides the notebooks: recorded in the JSON."""
    from .. import __version__

    return {"seed": seed, "seed_source": "--seed" if seed_given else "fresh secret",
            "timeout_s": timeout, "jobs": jobs, "commit": _commit(),
            "clusterlab_version": __version__, "isolation": isolation.method,
            "isolation_note": isolation.why,
            "limits": dataclasses.asdict(isolation.limits)}


def _trusted_modules(lab) -> list[list[str]]:
    """Files of the modules that define a lab's checks outside the package (tests' toy lab):
    the checking process imports them from here, not from the submission's folder."""
    found: dict[str, str] = {}
    for _, c in lab.checks:
        name = c.fn.__module__
        if name.split(".")[0] == "clusterlab" or name in found:
            continue
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            found[name] = os.path.realpath(module.__file__)
    return [[n, f] for n, f in found.items()]


def _stage(path: Path, nb, dest: Path) -> str:
    """The submission's private folder: its notebook and the plain files beside it (helper
    modules, data); no other notebook (another learner's), no folder, no symlink."""
    dest.mkdir(mode=0o755)
    name = path.name
    nbformat.write(nb, dest / name)
    for q in path.parent.iterdir():
        if q.name == name or q.suffix == ".ipynb" or q.name.startswith(".clusterlab-"):
            continue
        try:
            st = q.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size > 64 << 20:
            continue
        with contextlib.suppress(OSError):
            fd = os.open(q, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as src, open(dest / q.name, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return name


def _env(workdir: Path, isolated: bool) -> dict:
    """The sandbox's environment: none of the grader's (tokens, the seed), a home of its own."""
    env = {k: v for k, v in os.environ.items()
           if k in _PASSED_ENV or k.startswith("LC_")
           or (k.startswith("CLUSTERLAB_") and k not in _LAB_ENV)}
    home = str(workdir)
    env.update(HOME=home, USER="learner", TMPDIR="/tmp" if isolated else str(workdir / ".tmp"),
               JUPYTER_RUNTIME_DIR=f"{home}/.jupyter/runtime", IPYTHONDIR=f"{home}/.ipython",
               MPLCONFIGDIR=f"{home}/.matplotlib", NUMBA_CACHE_DIR=f"{home}/.numba",
               XDG_CACHE_HOME=f"{home}/.cache", PYTHONDONTWRITEBYTECODE="1",
               MPLBACKEND="Agg", CLUSTERLAB_LAB_GRADING="1")
    if not isolated:
        (workdir / ".tmp").mkdir(exist_ok=True)
    return env


@dataclasses.dataclass
class _Ran:
    returncode: int | None  # None: the grader killed it at its deadline
    lines: list[str]
    stderr: str
    seconds: float
    peak_bytes: int


def _kill_tree(proc: subprocess.Popen) -> None:
    """The process and everything under it (in a sandbox, killing its init ends the rest)."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _launch(argv: list[str], *, work: Path, sub: Path, isolation: Isolation, uid: int,
            hide: list[str], keep: list[str], deadline_s: float, stdin: str = "",
            tag: str) -> _Ran:
    """Run argv in the submission's sandbox (or unisolated), with a hard deadline."""
    cgroups: list[str] = []
    isolated = isolation.method != "none"
    if isolated:
        cgroups, limited = sandbox.make_cgroups(isolation.limits)
        spec = sandbox.Spec(argv=argv, workdir=str(sub), uid=uid, hide=hide,
                            keep=sandbox.default_keep(keep), cgroups=cgroups,
                            limits=isolation.limits, memory_by_cgroup="memory" in limited)
        argv = sandbox.command(spec)
    err_path = work / f"{tag}.stderr"
    lines: list[str] = []
    peak = [0]
    seen: dict[int, psutil.Process] = {}  # everything it started: killed at the end
    t0 = time.monotonic()
    try:
        with open(err_path, "w") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=err, cwd=sub, env=_env(sub, isolated),
                                    start_new_session=True, text=True)

            def read() -> None:
                for line in proc.stdout:
                    if len(lines) < 10_000:
                        lines.append(line[:20_000])

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            with contextlib.suppress(OSError):
                proc.stdin.write(stdin)
                proc.stdin.close()
            returncode: int | None = None
            while True:
                with contextlib.suppress(psutil.Error):
                    for p in psutil.Process(proc.pid).children(recursive=True):
                        seen.setdefault(p.pid, p)
                    peak[0] = max(peak[0], tree_pss(proc.pid))
                try:
                    returncode = proc.wait(1.0)
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - t0 > deadline_s:
                        break
            if returncode is None:  # still running: not reaped, its pid is still its own
                _kill_tree(proc)
            for p in seen.values():  # is_running() compares start times: never a new owner
                with contextlib.suppress(psutil.Error):
                    if p.is_running():
                        p.kill()
            reader.join(5)
    finally:
        if cgroups:
            sandbox.remove_cgroups(cgroups)
    stderr = err_path.read_text(errors="replace")[-4000:] if err_path.exists() else ""
    return _Ran(returncode, lines, stderr, time.monotonic() - t0, peak[0])


def _read_result(sub: Path) -> dict:
    """The runner's notes (written inside the sandbox: checked, and used for notes only)."""
    try:
        with open(sub / worker.RESULT, "rb") as f:
            raw = json.loads(f.read(1 << 20))
        return {"error": str(raw.get("error", ""))[:300],
                "cell_errors": [str(e)[:300] for e in list(raw.get("cell_errors", []))[:50]],
                "seconds": float(raw.get("seconds", 0.0))}
    except (OSError, ValueError, TypeError, AttributeError):
        return {"error": "", "cell_errors": [], "seconds": 0.0}


def _parse_outcomes(lines: list[str]) -> tuple[dict, tuple | None, bool]:
    outcomes, started, done = {}, None, False
    for line in lines:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict):
            continue
        if "started" in msg:
            started = tuple(msg["started"])
        elif "outcome" in msg:
            ex, check, status, message, seconds = msg["outcome"]
            outcomes[(ex, check)] = (str(status), str(message), float(seconds))
            started = None
        elif msg.get("done"):
            done = True
    return outcomes, started, done


def grade_one(path: Path, learner: str, *, timeout: float, seed: int,
              isolation: Isolation | None = None, hide: list[str] | None = None) -> dict:
    isolation = isolation or Isolation.detect()
    row = {"path": str(path), "learner": learner, "lab": None, "status": "", "note": "",
           "checks": [], "earned": 0, "possible": 0, "seconds": 0.0, "check_seconds": 0.0,
           "peak_mb": 0.0, "isolation": isolation.label}
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
    lab = labs[lab_id]
    names = sorted({n for ex in lab.exercises for n in ex.needs})
    hide = default_hide_for([path]) if hide is None else hide
    # Named after this process: if the grader is killed, the next cluster's start sweeps it.
    work = Path(tempfile.mkdtemp(prefix=f"clusterlab-{os.getpid()}-grade-"))
    try:
        sub = work / "submission"
        name = _stage(path, nb, sub)
        uid = sandbox.new_uid() if isolation.method != "none" else os.getuid()
        if isolation.method != "none":
            for q in [sub, *sub.rglob("*")]:
                os.chown(q, uid, uid, follow_symlinks=False)
        modules = _trusted_modules(lab)
        common = {"work": work, "sub": sub, "isolation": isolation, "uid": uid, "hide": hide,
                  "keep": [os.path.dirname(f) for _, f in modules]}
        ran = _launch([sys.executable, "-P", "-s", WORKER, "run", name, repr(float(timeout)),
                       json.dumps(names)], deadline_s=timeout + KERNEL_START_S
                      + worker.EXPORT_TIMEOUT + MARGIN_S, tag="run", **common)
        if ran.returncode == sandbox.SETUP_FAILED and "sandbox setup failed" in ran.stderr:
            row.update(status=GRADER_ERROR, note=_last_line(ran.stderr))
            return row
        result = _read_result(sub)
        error = result["error"]
        if ran.returncode is None:
            error = f"timed out: the notebook did not finish within {timeout:g} s"
        elif ran.returncode != 0 and not error:
            error = f"the notebook's run ended with exit code {ran.returncode}"
        check_deadline = timeout + MARGIN_S  # the checks get as long as the cells, + a start
        if (sub / worker.EXPORT).is_file():
            checked = _launch([sys.executable, "-P", "-s", WORKER, "check", lab_id,
                               json.dumps(modules)], deadline_s=check_deadline,
                              stdin=json.dumps({"seed": seed}) + "\n", tag="check", **common)
        else:  # nothing to check: the kernel died (or was stopped) before it handed them over
            checked = _Ran(0, [], "", 0.0, 0)
        if checked.returncode == sandbox.SETUP_FAILED and "sandbox setup failed" in \
                checked.stderr:
            row.update(status=GRADER_ERROR, note=_last_line(checked.stderr))
            return row
        outcomes, stuck, done = _parse_outcomes(checked.lines)
        if done:
            lost = ""
        elif not checked.lines and checked.seconds == 0.0:
            lost = "the notebook's kernel never handed its objects to the grader"
        elif checked.returncode is None:
            lost = f"the grader's run of the checks ran out of time ({check_deadline:g} s)"
        else:
            lost = ("the grader's run of the checks ended (exit code "
                    f"{checked.returncode}: a crash, os._exit or too much memory)")
        if stuck and lost:
            lost += f", in check {stuck[1]!r} of {stuck[0]}"
        why_missing = error or (result["cell_errors"][0] if result["cell_errors"] else "")
        for ex, c in lab.checks:
            o = outcomes.get((ex.id, c.name))
            if o is None or o[0] not in ("pass", "fail", "todo"):
                status = "not run"
                message = lost or "the grader did not get its outcome"
                if why_missing:
                    message += f" (the notebook: {why_missing})"
                seconds = 0.0
            else:
                status, message, seconds = o
            row["checks"].append({"exercise": ex.id, "check": c.name, "hidden": c.hidden,
                                  "points": c.points, "earned": c.points if status == "pass"
                                  else 0, "status": status, "message": message,
                                  "seconds": round(seconds, 2)})
        row["earned"] = sum(c["earned"] for c in row["checks"])
        row["possible"] = sum(c["points"] for c in row["checks"])
        row["seconds"] = round(result["seconds"] or ran.seconds, 1)
        row["check_seconds"] = round(checked.seconds, 1)
        row["peak_mb"] = round(max(ran.peak_bytes, checked.peak_bytes) / 2**20, 1)
        notes = []
        if error:
            row["status"] = "timed out" if error.startswith("timed out") else "crashed"
            notes.append(error)
        else:
            row["status"] = "graded"
        if result["cell_errors"]:
            notes.append(f"{len(result['cell_errors'])} cell(s) raised; first: "
                         f"{result['cell_errors'][0]}")
        if lost:
            notes.append(lost)
        row["note"] = "; ".join(notes)
        return row
    except Exception as exc:  # noqa: BLE001 - the grader failed on this row: say so, go on
        row.update(status=GRADER_ERROR, note=f"{type(exc).__name__}: {str(exc)[:300]}")
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def default_hide_for(paths: list[str | Path]) -> list[str]:
    return sandbox.default_hide([str(p) for p in paths])


def grade(paths: list[str | Path], *, timeout: float = DEFAULT_TIMEOUT,
          seed: int | None = None, jobs: int = 1, progress=None,
          isolation: Isolation | None = None, info: dict | None = None) -> list[dict]:
    """Grade every notebook; one row per notebook, in the order of `collect`.

    `seed`: the hidden checks' seed; None draws a fresh secret one (recorded in `info`, a
    dict filled with what the grade depends on: seed, timeout, commit, version, isolation).
    `jobs` > 1 grades that many notebooks at once. Labs that time real clusters share the
    machine's cores then: give a laptop 1 or 2, a many-core host more."""
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1, got {jobs!r}")
    files = collect(paths)
    if not files:
        raise ValueError("no notebooks to grade in: " + " ".join(map(str, paths)))
    seed_given = seed is not None
    seed = seed if seed_given else new_seed()
    isolation = isolation or Isolation.detect()
    if info is not None:
        info.update(run_info(seed=seed, seed_given=seed_given, timeout=timeout, jobs=jobs,
                             isolation=isolation))
    names = _learner_names(files)
    hide = default_hide_for(paths)

    def one(path: Path) -> dict:
        if progress:
            progress(f"grading {path} ...")
        return grade_one(path, names[path], timeout=timeout, seed=seed, isolation=isolation,
                         hide=hide)

    if jobs == 1:
        return [one(path) for path in files]
    # Threads suffice: each notebook runs in processes of its own (its sandbox).
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(jobs, len(files))) as pool:
        return list(pool.map(one, files))


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
    failed = [r for r in rows if r["status"] == GRADER_ERROR]
    if failed:
        out.append("the grader failed on (not the learners' fault; exit code 2):")
        for r in failed:
            out.append(f"  {r['path']}: {r['note']}")
        out.append("")
    unisolated = sorted({r["isolation"] for r in rows
                         if r.get("isolation", "").startswith("NOT ISOLATED")})
    for label in unisolated:
        n = sum(1 for r in rows if r.get("isolation") == label)
        out.append(f"{n} notebook(s) ran {label}")
    n_ok = sum(1 for r in rows if r["lab"] and r["status"] == "graded"
               and all(c["status"] == "pass" for c in r["checks"]))
    out.append(f"{n_ok} of {len(rows)} notebook(s) passed every check")
    return "\n".join(out)


def exit_code(rows: list[dict]) -> int:
    """0: every notebook passed every check; 1: graded, and some points were lost (or some
    notebooks were not labs, crashed or timed out: the learners' doing); 2: the grader
    itself failed on at least one notebook."""
    if any(r["status"] == GRADER_ERROR for r in rows):
        return 2
    return 0 if all_passed(rows) else 1
