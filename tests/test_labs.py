"""The lab machinery: checks and their messages, the solutions -> labs builder, the grader.

Uses a toy lab (tests/data/toy_lab.py) so these tests do not depend on the course's labs;
the course's labs are tested in tests/test_lab_*.py and by nbval over solutions/.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from clusterlab.labs import EXERCISES, LABS, run_checks
from clusterlab.labs.build import annotate, to_lab
from clusterlab.labs.grade import all_passed, collect, grade, table

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def toy():
    if "99_toy" not in LABS:
        sys.path.insert(0, str(DATA))
        import toy_lab  # noqa: F401 - registers the lab

    return LABS["99_toy"]


def _add(a, b):
    return a + b


def _add_wrong(a, b):
    return a - b


def _todo(a, b):
    raise NotImplementedError("add: your code here")


def _boom(a, b):
    return {}[a]


def test_a_passing_answer_passes_visible_checks_and_skips_hidden(toy):
    report = run_checks("toy_add", {"add": _add}, hidden=False)
    assert [o.status for o in report.outcomes] == ["pass", "skip"]
    assert report.passed and (report.earned, report.possible) == (1, 1)
    assert "1 hidden check(s)" in report.text()
    report = run_checks("toy_add", {"add": _add}, hidden=True)
    assert [o.status for o in report.outcomes] == ["pass", "pass"] and report.earned == 3


def test_a_wrong_answer_fails_with_the_check_s_sentence_and_offers_a_hint(toy):
    report = run_checks("toy_add", {"add": _add_wrong}, hidden=True)
    assert report.outcomes[0].status == "fail"
    assert "add(2, 3) returned -1, not 5" in report.outcomes[0].message
    assert not report.passed and report.earned == 0
    assert 'hint("toy_add")' in report.text()


def test_not_implemented_and_undefined_are_todo_not_errors(toy):
    for ns in ({"add": _todo}, {}):
        report = run_checks("toy_add", ns, hidden=True)
        assert [o.status for o in report.outcomes] == ["todo", "todo"]
        assert all("not implemented yet" in o.message for o in report.outcomes)


def test_a_crash_in_learner_code_is_a_sentence_not_a_traceback(toy):
    (outcome, _) = run_checks("toy_add", {"add": _boom}, hidden=True).outcomes
    assert outcome.status == "fail"
    assert "_boom raised KeyError: 2" in outcome.message
    assert "Traceback" not in outcome.message


def _rank_deadlock():
    import torch
    import torch.distributed as dist

    t = torch.zeros(1)
    if dist.get_rank() == 0:
        dist.recv(t, src=1)  # rank 1 also receives first: nobody sends
    else:
        dist.recv(t, src=0)
    return 0


def _rank_raises():
    import torch.distributed as dist

    if dist.get_rank() == 2:
        raise ValueError("bad shape")
    return 3


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_distributed_checks_name_ranks_and_operations(toy, no_leftovers):
    import toy_lab

    ok = run_checks("toy_rank_sum", {"rank_sum": toy_lab.reference_rank_sum})
    assert ok.passed, ok.text()
    (hang,) = run_checks("toy_rank_sum", {"rank_sum": _rank_deadlock}).outcomes
    assert hang.status == "fail" and "timed out after 5 s" in hang.message
    assert "rank 0 in recv at `dist.recv(t, src=1)`" in hang.message
    assert "rank 1 in recv at `dist.recv(t, src=0)` (in _rank_deadlock)" in hang.message
    assert hang.seconds < 15
    (err,) = run_checks("toy_rank_sum", {"rank_sum": _rank_raises}).outcomes
    assert err.status == "fail" and err.message.startswith("rank 2 raised ValueError: bad shape")


def test_unknown_exercise_names_the_known_ones(toy):
    with pytest.raises(ValueError, match="toy_add"):
        run_checks("toy_nope", {})


# --- builder ---------------------------------------------------------------------------------


def _toy_notebook(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["clusterlab"] = {"lab": "99_toy"}
    nb.cells = cells
    return nb


SOLVED_ADD = '''def add(a, b):
    """Return a + b."""
    # TASK: return the sum of a and b
    ### BEGIN SOLUTION
    total = a + b  # the secret
    return total
    ### END SOLUTION'''


def test_builder_turns_solution_blocks_into_todos_and_marks_graded_cells(toy):
    nb = _toy_notebook([
        nbformat.v4.new_markdown_cell("# Toy\nWhy?\n### BEGIN SOLUTION\nBecause.\n"
                                      "### END SOLUTION"),
        nbformat.v4.new_code_cell(SOLVED_ADD),
        nbformat.v4.new_code_cell('# NBVAL_IGNORE_OUTPUT\ncheck("toy_add")'),
        nbformat.v4.new_code_cell('check("toy_rank_sum")'),
    ])
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="5\n")]
    annotate(nb, "99_toy")
    lab = to_lab(nb, "99_toy")
    md, code, graded, _ = lab.cells
    assert "Because." not in md.source and "_Your answer here._" in md.source
    assert "the secret" not in code.source and "return total" not in code.source
    assert "    # TODO: return the sum of a and b" in code.source
    # a task line inside the block would vanish under nbgrader's generate_assignment
    inside = nbformat.v4.new_code_cell(SOLVED_ADD.replace(
        "    # TASK: return the sum of a and b\n    ### BEGIN SOLUTION\n",
        "    ### BEGIN SOLUTION\n    # TASK: return the sum of a and b\n"))
    with pytest.raises(ValueError, match="TASK.*inside the solution block"):
        to_lab(_toy_notebook([inside]), "99_toy")
    assert code.source.rstrip().endswith('    raise NotImplementedError("add is not written yet")')
    assert code.outputs == [] and nb.cells[1].outputs  # the solution keeps its outputs
    assert code.metadata["nbgrader"]["solution"] is True
    assert graded.metadata["nbgrader"] == {
        "grade": True, "grade_id": "check-toy_add", "locked": True, "points": 3,
        "schema_version": 3, "solution": False, "task": False}
    assert graded["id"] == "check-toy_add"
    ns: dict = {}
    exec(code.source, ns)  # the lab's cell still runs, and defines a function
    with pytest.raises(NotImplementedError):
        ns["add"](1, 2)


@pytest.mark.parametrize("source, message", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without a BEGIN"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside another block"),
])
def test_builder_rejects_unbalanced_blocks(toy, source, message):
    nb = _toy_notebook([nbformat.v4.new_code_cell(source),
                        nbformat.v4.new_code_cell('check("toy_add")\ncheck("toy_rank_sum")')])
    with pytest.raises(ValueError, match=message):
        annotate(nb, "99_toy")
        to_lab(nb, "99_toy")


def test_builder_requires_a_check_cell_per_exercise_and_known_labs(toy):
    nb = _toy_notebook([nbformat.v4.new_code_cell('check("toy_add")')])
    with pytest.raises(ValueError, match="no cell calls check\\(\\) for toy_rank_sum"):
        annotate(nb, "99_toy")
    with pytest.raises(ValueError, match="does not define"):
        annotate(nb, "98_missing")
    nb.cells.append(nbformat.v4.new_code_cell('check("ring_allreduce")'))
    with pytest.raises(ValueError, match="not an exercise of this lab"):
        annotate(nb, "99_toy")


# --- grader ----------------------------------------------------------------------------------

IMPORT_TOY = ("import sys\nsys.path.insert(0, '.')\nimport toy_lab\n"
              "from clusterlab.labs import check")


def _write(folder: Path, name: str, cells: list[str], lab: str | None = "99_toy") -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    if lab:
        nb.metadata["clusterlab"] = {"lab": lab}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DATA / "toy_lab.py", folder / "toy_lab.py")
    path = folder / name
    nbformat.write(nb, path)
    return path


SOLVED = [IMPORT_TOY, "def add(a, b):\n    return a + b",
          "import toy_lab\nrank_sum = toy_lab.reference_rank_sum",
          'check("toy_add")', 'check("toy_rank_sum")']


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_grading_a_mixed_room_gives_one_clear_row_each(toy, tmp_path, no_leftovers):
    room = tmp_path / "room"
    _write(room / "alice", "lab.ipynb", SOLVED)
    _write(room / "bob", "lab.ipynb", [IMPORT_TOY, "def add(a, b):\n    return a - b",
                                       'check("toy_add")'])
    _write(room / "carol", "lab.ipynb", [IMPORT_TOY, "def add(a, b):\n    raise "
                                         "NotImplementedError('add')", 'check("toy_add")',
                                         'check("toy_rank_sum")'])
    _write(room / "dave", "lab.ipynb", [IMPORT_TOY, "import os\nos._exit(3)", *SOLVED[1:]])
    _write(room / "erin", "lab.ipynb", [IMPORT_TOY, "import time\ntime.sleep(600)", *SOLVED[1:]])
    _write(room / "frank", "notes.ipynb", ["1 + 1"], lab=None)
    (room / "gina").mkdir()
    (room / "gina" / "lab.ipynb").write_text("{ not json")
    rows = grade([room], timeout=15, seed=7, jobs=2)  # two workers: the order is kept
    assert [r["path"] for r in rows] == [str(q) for q in collect([room])]
    by = {r["learner"]: r for r in rows}
    assert set(by) == {"alice", "bob", "carol", "dave", "erin", "frank", "gina"}
    assert by["alice"]["status"] == "graded" and by["alice"]["earned"] == 5
    assert [c["status"] for c in by["alice"]["checks"]] == ["pass"] * 3
    # the grader runs every check itself: bob's rank_sum was never written, so "todo"
    assert [c["status"] for c in by["bob"]["checks"]] == ["fail", "fail", "todo"]
    assert by["bob"]["earned"] == 0 and "returned -1" in by["bob"]["checks"][0]["message"]
    assert [c["status"] for c in by["carol"]["checks"]] == ["todo"] * 3
    assert by["dave"]["status"] == "crashed" and by["dave"]["earned"] == 0
    assert "the kernel died" in by["dave"]["note"]
    assert by["erin"]["status"] == "timed out" and "15 s" in by["erin"]["note"]
    assert by["frank"]["status"] == "not a lab" and by["gina"]["status"] == "unreadable"
    assert not all_passed(rows) and all_passed([by["alice"]])
    text = table(rows)
    assert "99_toy: A toy lab (5 points)" in text
    assert "alice" in text and "5/5" in text and "bob c1 [fail]: add(2, 3) returned -1" in text
    assert "frank" in text and "not a lab" in text and "1 of 7 notebook(s)" in text


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True, "2"])
def test_grade_rejects_a_bad_number_of_jobs(jobs, tmp_path):
    with pytest.raises(ValueError, match="jobs must be a whole number >= 1"):
        grade([tmp_path], jobs=jobs)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_grade_command_exit_code_and_json(toy, tmp_path, no_leftovers):
    good = _write(tmp_path / "a", "lab.ipynb", SOLVED)
    bad = _write(tmp_path / "b", "lab.ipynb", [IMPORT_TOY, 'check("toy_add")',
                                               'check("toy_rank_sum")'])
    out = tmp_path / "grades.json"
    # The grader must know the toy lab's checks (the kernels import it from their folder):
    # run the command with a prelude that registers it.
    prelude = f"import sys; sys.path.insert(0, {str(DATA)!r}); import toy_lab; "
    cmd = [sys.executable, "-c", prelude + "from clusterlab.cli import main; sys.exit(main())",
           "grade"]
    ok = subprocess.run(cmd + [str(good), "-o", str(out)], capture_output=True, text=True,
                        timeout=200)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert rows[0]["earned"] == rows[0]["possible"] == 5
    assert result["grader"]["timeout_s"] == 300 and result["grader"]["seed"] > 0
    assert result["grader"]["clusterlab_version"] and "commit" in result["grader"]
    mixed = subprocess.run(cmd + [str(good), str(bad)], capture_output=True, text=True,
                           timeout=200)
    assert mixed.returncode == 1 and "1 of 2 notebook(s) passed every check" in mixed.stdout
    missing = subprocess.run(cmd + [str(tmp_path / "nope.ipynb")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr


def test_every_exercise_belongs_to_one_lab():
    for ex in EXERCISES.values():
        assert ex in LABS[ex.lab].exercises
        assert ex.checks, f"exercise {ex.id} has no checks"
