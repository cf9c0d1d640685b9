"""The grader cannot be fooled or harmed: outcomes come from its own run of the checks, its
seed is secret, exit codes tell lost points from a grader failure, and each submission runs
in a sandbox (as root on Linux) whose hostile notebooks get a clear row each.

The hostile notebooks attack, then define `add` right only if the attack was stopped, so a
passed "adds" check means "contained". Attacks that could hurt the machine if the sandbox
were missing (a fork bomb, kill(-1)) first check that they run inside one (a user id of the
sandbox's range, and the sandbox's script as pid 1), and are bounded anyway.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from clusterlab.labs import LABS, check, run_checks
from clusterlab.labs import grade as grade_mod
from clusterlab.labs.core import ENV_GRADING, Unavailable
from clusterlab.labs.grade import Isolation, exit_code, grade, table
from clusterlab.labs.sandbox import Limits, probe

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]
ISOLATED = probe()[0] != "none"
needs_sandbox = pytest.mark.skipif(not ISOLATED, reason=f"no sandbox here: {probe()[1]}")
LIMITS = Limits(memory_mb=2048, tasks=256, file_mb=64)


@pytest.fixture(scope="module")
def labs():
    if str(DATA) not in sys.path:
        sys.path.insert(0, str(DATA))
    import probe_lab  # noqa: F401 - registers 98_probe
    import toy_lab  # noqa: F401 - registers 99_toy

    return LABS


def _notebook(folder: Path, cells: list[str], *, lab: str = "98_probe",
              module: str = "probe_lab.py", name: str = "lab.ipynb") -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["clusterlab"] = {"lab": lab}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / module).exists():
        shutil.copy(DATA / module, folder / module)
    nbformat.write(nb, folder / name)
    return folder / name


IMPORT = ("import os, sys, json\nsys.path.insert(0, '.')\nimport probe_lab\n"
          "from clusterlab.labs import check")
# True only inside a sandbox: its user id range, and its setup script as the pid namespace's 1.
SANDBOXED = ("def _sandboxed():\n"
             "    try:\n"
             "        init = open('/proc/1/cmdline', 'rb').read()\n"
             "    except OSError:\n"
             "        return False\n"
             "    return os.getuid() >= 0x40000000 and b'clusterlab/labs/sandbox.py' in init\n"
             "SANDBOXED = _sandboxed()")
# A learner who forges: the old log channel, a seed in the environment, the kernel's own
# check machinery patched, and a doctored copy of the lab's module in the folder.
FORGER = [
    IMPORT,
    "import clusterlab.labs.core as core\n"
    "for path in [os.environ.get('CLUSTERLAB_GRADE_LOG'), 'grade.jsonl']:\n"
    "    if path:\n"
    "        with open(path, 'a') as f:\n"
    "            for ex, c in probe_lab.LAB.checks:\n"
    "                f.write(json.dumps({'exercise': ex.id, 'check': c.name, 'points': "
    "c.points, 'hidden': c.hidden, 'status': 'pass', 'message': '', 'seconds': 0.0}) + '\\n')\n"
    "os.environ['CLUSTERLAB_LAB_SEED'] = '1'\n"
    "os.environ['CLUSTERLAB_LAB_HIDDEN'] = '1'\n"
    "real = core.run_checks\n"
    "def forged(exercise, namespace, **kw):\n"
    "    report = real(exercise, namespace, **kw)\n"
    "    for o in report.outcomes:\n"
    "        o.status = 'pass'\n"
    "    return report\n"
    "core.run_checks = forged",
    "def seed_guess():\n    return int(os.environ.get('CLUSTERLAB_LAB_SEED', '1'))",
    "def add(a, b):\n    raise NotImplementedError('add')",
    'check("probe_sum")', 'check("probe_seed")',
]
DOCTORED = '''from clusterlab.labs import Lab
LAB = Lab("98_probe", "doctored", follows="00_start_here")
SUM = LAB.exercise("probe_sum", needs=("add",))
SEED = LAB.exercise("probe_seed", needs=("seed_guess",))
for ex, names in ((SUM, ("adds small integers", "adds random floats")),
                  (SEED, ("names the grader's seed",))):
    for n in names:
        ex.check(n)(lambda ctx: None)
'''


# --- fast: the pieces --------------------------------------------------------------------------


def test_check_under_the_grader_only_says_the_grader_runs_it(labs, monkeypatch, capsys):
    monkeypatch.setenv(ENV_GRADING, "1")
    check("probe_sum", add=lambda a, b: a - b)
    out = capsys.readouterr().out
    assert "the grader runs this exercise's checks after the notebook" in out
    assert "FAIL" not in out and "PASS" not in out


def test_run_checks_writes_no_outcome_log_a_kernel_could_also_write(labs, tmp_path,
                                                                     monkeypatch):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("CLUSTERLAB_GRADE_LOG", str(log))
    run_checks("probe_sum", {"add": lambda a, b: a + b}, hidden=True, seed=3)
    assert not log.exists()


def test_an_object_that_could_not_be_carried_out_fails_saying_why(labs):
    (o, _) = run_checks("probe_sum", {"add": Unavailable("pickling it failed: socket")},
                        hidden=True, seed=3).outcomes
    assert o.status == "fail" and "could not be handed to the grader" in o.message
    assert "pickling it failed: socket" in o.message


def test_outcome_lines_that_are_not_outcomes_are_ignored():
    lines = ["garbage\n", "[1, 2]\n", json.dumps({"started": ["e", "c"]}) + "\n",
             json.dumps({"outcome": ["e", "c", "pass", "", 0.5]}) + "\n",
             json.dumps({"started": ["e", "d"]}) + "\n"]
    outcomes, stuck, done = grade_mod._parse_outcomes(lines)
    assert outcomes == {("e", "c"): ("pass", "", 0.5)} and stuck == ("e", "d") and not done


def _row(status="graded", checks=("pass",)):
    return {"status": status, "lab": "98_probe", "checks": [{"status": s} for s in checks]}


def test_exit_codes_separate_lost_points_from_a_grader_failure():
    assert exit_code([_row()]) == 0
    assert exit_code([_row(), _row(checks=("pass", "fail"))]) == 1
    assert exit_code([_row(), _row(status="timed out"), _row(status="not a lab", checks=())]) == 1
    assert exit_code([_row(), _row(status="grader error", checks=())]) == 2


def test_a_grader_failure_on_one_notebook_is_a_row_and_exit_code_2(labs, tmp_path,
                                                                   monkeypatch):
    good = _notebook(tmp_path / "a", [IMPORT])

    def broken(*args, **kwargs):
        raise RuntimeError("no more file descriptors")

    monkeypatch.setattr(grade_mod, "_launch", broken)
    rows = grade([good], timeout=10, isolation=Isolation("none", "test"))
    assert rows[0]["status"] == "grader error" and "no more file descriptors" in rows[0]["note"]
    assert exit_code(rows) == 2 and "the grader failed on" in table(rows)


def test_the_command_exits_2_when_the_grader_itself_fails(labs, tmp_path, monkeypatch, capsys):
    from clusterlab.cli import main

    good = _notebook(tmp_path / "a", [IMPORT])
    monkeypatch.setattr(grade_mod, "grade", lambda *a, **k: 1 / 0)
    assert main(["grade", str(good), "--no-sandbox"]) == 2
    assert "the grader failed: ZeroDivisionError" in capsys.readouterr().err


def test_grade_help_documents_the_exit_codes(capsys):
    from clusterlab.cli import main

    with pytest.raises(SystemExit):
        main(["grade", "--help"])
    out = capsys.readouterr().out
    assert "exit codes:" in out and "2  the grader failed" in out and "-j JOBS" in out


def test_the_sandbox_environment_has_none_of_the_grader_s(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERLAB_LAB_SEED", "42")
    monkeypatch.setenv("CLUSTERLAB_LAB_HIDDEN", "1")
    monkeypatch.setenv("GITHUB_TOKEN", "secret")
    monkeypatch.setenv("CLUSTERLAB_DILATION", "2")
    env = grade_mod._env(tmp_path, isolated=True)
    assert "CLUSTERLAB_LAB_SEED" not in env and "CLUSTERLAB_LAB_HIDDEN" not in env
    assert "GITHUB_TOKEN" not in env and "JPY_PARENT_PID" not in env
    assert env["CLUSTERLAB_DILATION"] == "2" and env["HOME"] == str(tmp_path)
    assert env[ENV_GRADING] == "1"


def test_staging_copies_the_notebook_and_plain_files_only(tmp_path):
    room = tmp_path / "room"
    nb = _notebook(room, ["1"], name="alice.ipynb")
    _notebook(room, ["2"], name="bob.ipynb")
    (room / "helper.py").write_text("X = 1\n")
    (room / "sub").mkdir()
    (room / "sub" / "deep.py").write_text("")
    (room / "link.py").symlink_to("/etc/hostname")
    dest = tmp_path / "stage"
    name = grade_mod._stage(nb, nbformat.read(nb, as_version=4), dest)
    assert name == "alice.ipynb"
    assert sorted(p.name for p in dest.iterdir()) == ["alice.ipynb", "helper.py",
                                                      "probe_lab.py"]


def test_each_run_draws_a_fresh_seed_and_records_what_the_grade_depends_on():
    seeds = {grade_mod.new_seed() for _ in range(5)}
    assert len(seeds) == 5
    info = grade_mod.run_info(seed=7, seed_given=True, timeout=30.0, jobs=2,
                              isolation=Isolation("none", "test"))
    assert info["seed"] == 7 and info["seed_source"] == "--seed" and info["timeout_s"] == 30.0
    assert info["clusterlab_version"] and "commit" in info and info["isolation"] == "none"


def test_labs_outside_the_package_are_imported_from_the_grader_s_files(labs):
    assert grade_mod._trusted_modules(labs["98_probe"]) == [
        ["probe_lab", str((DATA / "probe_lab.py").resolve())]]
    assert grade_mod._trusted_modules(labs["02_ring_allreduce"]) == []


# --- slow: real notebooks ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("isolated", [False, pytest.param(True, marks=needs_sandbox)])
def test_a_notebook_that_forges_passes_scores_nothing_for_them(labs, tmp_path, isolated,
                                                               no_leftovers):
    forger = _notebook(tmp_path / "forger", FORGER)
    (tmp_path / "forger" / "probe_lab.py").write_text(DOCTORED)
    honest = _notebook(tmp_path / "honest", [IMPORT, "def add(a, b):\n    return a + b",
                                             "def seed_guess():\n    return 12345"])
    isolation = Isolation.detect(wanted=isolated, limits=LIMITS)
    info: dict = {}
    rows = grade([forger, honest], timeout=60, isolation=isolation, info=info, jobs=2)
    by = {r["learner"]: r for r in rows}
    f, h = by["forger"], by["honest"]
    assert f["status"] == "graded", f
    assert f["earned"] == 0, f["checks"]
    assert [c["status"] for c in f["checks"]] == ["todo", "todo", "fail"]
    assert info["seed"] != 1 and info["seed_source"] == "fresh secret"
    assert [c["status"] for c in h["checks"]] == ["pass", "pass", "fail"]
    assert (f["isolation"] == "sandbox") == isolated
    # given --seed, the checks use it: the honest hard-coded guess of 12345 now passes
    rows = grade([honest], timeout=60, seed=12345, isolation=isolation)
    assert rows[0]["earned"] == rows[0]["possible"] == 3


def _hostile_room(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    room = tmp_path / "room"
    solved_toy = ["import sys\nsys.path.insert(0, '.')\nimport toy_lab\n"
                  "from clusterlab.labs import check",
                  "def add(a, b):\n    return a + b",
                  "import toy_lab\nrank_sum = toy_lab.reference_rank_sum",
                  'check("toy_add")', 'check("toy_rank_sum")']
    alice = _notebook(room / "alice", solved_toy, lab="99_toy", module="toy_lab.py")
    outside = tmp_path / "outside"
    outside.mkdir()
    grader_pid = os.getpid()
    attacks = {
        "reader": f"stolen = []\n"
                  f"for p in [{str(alice)!r}, {str(ROOT / 'solutions')!r}, "
                  f"{str(tmp_path / 'home' / 'secret.txt')!r}]:\n"
                  f"    try:\n"
                  f"        stolen += os.listdir(p) if os.path.isdir(p) else [open(p).read()]\n"
                  f"    except OSError:\n"
                  f"        pass\n"
                  f"ok = not stolen",
        "writer": f"wrote = []\n"
                  f"for p in [{str(outside / 'pwned.txt')!r}, {str(ROOT / 'pwned.txt')!r}, "
                  f"{str(alice.parent / 'pwned.txt')!r}, '/etc/pwned.txt']:\n"
                  f"    try:\n"
                  f"        open(p, 'w').write('x')\n"
                  f"        wrote.append(p)\n"
                  f"    except OSError:\n"
                  f"        pass\n"
                  f"ok = not wrote",
        "network": "import socket\n"
                   "try:\n"
                   "    socket.create_connection(('1.1.1.1', 53), timeout=3).close()\n"
                   "    ok = False\n"
                   "except OSError:\n"
                   "    ok = True",
        "forkbomb": SANDBOXED + "\n"
                    "import time\n"
                    "pids, stopped = [], None\n"
                    "for _ in range(2000 if SANDBOXED else 0):\n"
                    "    try:\n"
                    "        pid = os.fork()\n"
                    "    except OSError as exc:\n"
                    "        stopped = type(exc).__name__\n"
                    "        break\n"
                    "    if pid == 0:\n"
                    "        time.sleep(60)\n"
                    "        os._exit(0)\n"
                    "    pids.append(pid)\n"
                    "for pid in pids:\n"
                    "    os.kill(pid, 9)\n"
                    "    os.waitpid(pid, 0)\n"
                    "ok = stopped is not None",
        "memory": "chunks = []\n"
                  "try:\n"
                  "    for _ in range(64):  # 4 GB at most\n"
                  "        chunks.append(bytearray(b'x') * (64 << 20))\n"
                  "    ok = False\n"
                  "except MemoryError:\n"
                  "    ok = True\n"
                  "del chunks",
        "killer": SANDBOXED + "\n"
                  "import signal\n"
                  "ok = SANDBOXED\n"
                  "if SANDBOXED:\n"
                  f"    for act in (lambda: os.killpg(os.getpgid({grader_pid}), signal.SIGKILL),\n"
                  f"                lambda: os.kill({grader_pid}, signal.SIGKILL)):\n"
                  "        try:\n"
                  "            act()\n"
                  "            ok = False\n"
                  "        except OSError:\n"
                  "            pass",
        "nuke": SANDBOXED + "\n"
                "import signal\n"
                "ok = True\n"
                "if SANDBOXED:\n"
                "    os.kill(-1, signal.SIGKILL)  # every process this user may signal",
        "sleeper": "ok = True",
    }
    cells = {}
    for who, attack in attacks.items():
        body = [IMPORT, attack, "def add(a, b):\n    return a + b if ok else a - b"]
        if who == "sleeper":
            body.append("import time\ntime.sleep(10**6)")
        cells[who] = body
        _notebook(room / who, body)
    return room, cells


@pytest.mark.slow
@pytest.mark.timeout(600)
@needs_sandbox
def test_hostile_notebooks_each_get_a_clear_row_and_harm_nothing(labs, tmp_path, no_leftovers,
                                                                  monkeypatch):
    (tmp_path / "home").mkdir()  # the instructor's home, with a secret in it
    (tmp_path / "home" / "secret.txt").write_text("the exam's answers")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    room, _ = _hostile_room(tmp_path)
    rows = grade([room], timeout=25, jobs=2,
                 isolation=Isolation.detect(limits=LIMITS))
    by = {r["learner"]: r for r in rows}
    text = table(rows)

    def adds(who):
        return by[who]["checks"][0]["status"]

    assert by["alice"]["status"] == "graded" and by["alice"]["earned"] == 5, text
    for who in ("reader", "writer", "network", "forkbomb", "killer"):
        assert by[who]["status"] == "graded", (who, by[who], text)
        assert adds(who) == "pass", (who, by[who]["checks"][0], text)
        assert by[who]["isolation"] == "sandbox"
    # memory: stopped by the limit, as a MemoryError or as a killed kernel
    assert (by["memory"]["status"], adds("memory")) in {("graded", "pass"),
                                                        ("crashed", "not run")}, by["memory"]
    if by["memory"]["status"] == "crashed":
        assert "the kernel died" in by["memory"]["note"]
    assert by["nuke"]["status"] == "crashed" and by["nuke"]["earned"] == 0, by["nuke"]
    assert by["sleeper"]["status"] == "timed out" and adds("sleeper") == "pass", by["sleeper"]
    assert "25 s" in by["sleeper"]["note"]
    assert not (tmp_path / "outside" / "pwned.txt").exists()
    assert not (ROOT / "pwned.txt").exists() and not (room / "alice" / "pwned.txt").exists()
    assert exit_code(rows) == 1  # lost points, not a grader failure
    assert "NOT ISOLATED" not in text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_function_that_hangs_the_checks_loses_them_and_not_the_grader(labs, tmp_path,
                                                                       no_leftovers):
    hang = _notebook(tmp_path / "hang", [IMPORT, "import time\ndef add(a, b):\n"
                                         "    time.sleep(10**6)",
                                         "def seed_guess():\n    return 0"])
    rows = grade([hang], timeout=15, isolation=Isolation.detect(limits=LIMITS))
    (row,) = rows
    assert row["status"] == "graded"
    assert [c["status"] for c in row["checks"]] == ["not run", "not run", "not run"], row
    budget = 15 + grade_mod.MARGIN_S
    assert f"ran out of time ({budget:g} s), in check 'adds small integers'" in \
        row["checks"][0]["message"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_unisolated_rows_say_so(labs, tmp_path, no_leftovers):
    nb = _notebook(tmp_path / "a", [IMPORT, "def add(a, b):\n    return a + b"])
    out = tmp_path / "g.json"
    prelude = f"import sys; sys.path.insert(0, {str(DATA)!r}); import probe_lab; "
    cmd = [sys.executable, "-c", prelude + "from clusterlab.cli import main; sys.exit(main())",
           "grade", str(nb), "--no-sandbox", "--timeout", "60", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 notebook(s) ran NOT ISOLATED: isolation was switched off" in r.stdout
    result = json.loads(out.read_text())
    assert result["grader"]["isolation"] == "none"
    assert result["grader"]["seed_source"] == "fresh secret"
    assert result["rows"][0]["isolation"].startswith("NOT ISOLATED")


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are made by root")
def test_a_sandbox_s_cgroups_carry_its_limits_and_are_removed(tmp_path):
    from clusterlab.labs.sandbox import make_cgroups, remove_cgroups

    dirs, limited = make_cgroups(Limits(memory_mb=512, tasks=77))
    try:
        for d in dirs:
            values = {f.name: f.read_text().strip() for f in Path(d).iterdir()
                      if f.name in ("pids.max", "memory.limit_in_bytes", "memory.max")}
            for key, value in values.items():
                assert value == ("77" if key == "pids.max" else str(512 << 20)), (d, key)
    finally:
        remove_cgroups(dirs)
    assert not any(Path(d).exists() for d in dirs)
    assert set(limited) <= {"pids", "memory"}
