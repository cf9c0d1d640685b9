"""The course bench (`clusterlab bench course`): conditions really applied, failures and
"not shown" lines counted, nothing left behind. A synthetic notebook stands in for the
course, so the test takes seconds, not the course's half hour."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import psutil
import pytest

from clusterlab.bench import course

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("A notebook that reports where it ran."),
        # printed as a "not shown" line, so that the row tells the test what the kernel saw
        nbformat.v4.new_code_cell(
            "import os\nprint(f'Not shown on this run: cpus={len(os.sched_getaffinity(0))}')"),
        nbformat.v4.new_code_cell("print('Shown on this run: fine.')"),
        nbformat.v4.new_code_cell("1 / 0"),
    ]
    path = folder / "01_probe.ipynb"
    nbformat.write(nb, path)
    return path


def _spinners_alive() -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if p.info["cmdline"] and "while True: pass" in p.info["cmdline"]:
            found.append(p.pid)
    return found


def test_conditions_are_applied_and_failures_counted(tmp_path):
    cores = len(os.sched_getaffinity(0))
    out = course.run_course([_notebook(tmp_path)])
    rows = {r["condition"]: r for r in out["rows"]}
    assert list(rows) == list(course.CONDITIONS)
    assert rows["quiet"]["not_shown"] == [f"cell 1: Not shown on this run: cpus={cores}"]
    assert rows["one_cpu"]["not_shown"] == ["cell 1: Not shown on this run: cpus=1"]
    assert rows["busy"]["not_shown"] == [f"cell 1: Not shown on this run: cpus={cores}"]
    for r in rows.values():   # the failing cell is found under every condition
        assert r["cell_errors"] == ["cell 3: ZeroDivisionError: division by zero"]
        assert r["peak_pss_gb"] > 0
    limit = rows["one_cpu"]["memory_limit"]
    assert limit == "2 GB (memory cgroup)" or limit.startswith("not enforced")
    checks = {c["name"]: c for c in out["checks"]}
    assert not checks["busy: notebooks with a failed cell or no finish"]["ok"]
    assert checks["one_cpu: lines saying a conclusion was not shown here"]["measured"] == 1
    # nothing left behind: no spinner, no cgroup of this bench
    assert _spinners_alive() == []
    name = f"clusterlab-course-{os.getpid()}"
    assert not any(p.name == name for base in (Path("/sys/fs/cgroup"),)
                   for p in base.glob(f"**/{name}") if base.exists())
    lines = course.course_table(out["rows"])
    assert lines[2].startswith("| 01_probe | ") and "**1**" in lines[2]


def test_checks_hold_each_condition_to_its_quiet_run():
    def row(cond, name, wall, peak=0.5, errors=()):
        return {"condition": cond, "notebook": name, "wall_s": wall, "peak_pss_gb": peak,
                "error": "", "cell_errors": list(errors), "not_shown": []}

    rows = [row("quiet", "a", 10), row("quiet", "b", 20),
            row("busy", "a", 29), row("busy", "b", 61, peak=1.6)]
    checks = {c["name"]: c for c in course._checks(rows, ("quiet", "busy"))}
    slow = checks["busy: slowest notebook against its quiet run (x)"]
    assert slow["measured"] == 3.05 and not slow["ok"]          # 61 s against 20 s
    assert not checks["busy: largest peak memory, all processes (PSS, GB)"]["ok"]
    assert checks["quiet: notebooks with a failed cell or no finish"]["ok"]
    rows[2]["wall_s"] = None   # a notebook that did not finish has no ratio, not a crash
    rows[3]["wall_s"] = 30
    assert course._checks(rows, ("quiet", "busy"))[-1]["measured"] == 1.5
    # a solved lab named like a notebook is its own row, held to its own quiet run
    lab = [dict(r, kind="solved lab", wall_s=w) for r, w in zip(rows[:1] + rows[2:3], (100, 150))]
    both = course._checks(rows + lab, ("quiet", "busy"))
    assert both[-1]["measured"] == 1.5 and "| lab a |" in "\n".join(course.course_table(rows + lab))


def test_a_child_that_crashes_is_a_row(tmp_path):
    bad = tmp_path / "01_missing.ipynb"   # no such file: the child fails, the bench goes on
    r = course._child(bad, cpus=None, cgroup=None)
    assert r["wall_s"] is None and r["error"].startswith("the bench's child exited")


def test_course_paths_list_notebooks_then_solved_labs():
    paths = course.course_paths()
    kinds = [p.parent.name for p in paths]
    assert kinds == sorted(kinds, key=lambda k: k != "notebooks")
    assert {p.name[:3] for p in course.course_paths(quick=True)} == {"05_", "11_", "12_"}
