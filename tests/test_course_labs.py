"""The course's labs as shipped: generated from solutions/, no answers leaked, each tied to
its notebook, and every graded check of every lab fails cleanly ("not implemented yet").

That every solution passes every check (hidden ones included) is tested by nbval, which
test.sh runs over solutions/ with CLUSTERLAB_LAB_STRICT=1 and CLUSTERLAB_LAB_HIDDEN=1.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from clusterlab.labs import all_labs
from clusterlab.labs.build import BEGIN, END, TASK, build
from clusterlab.labs.grade import grade

ROOT = Path(__file__).resolve().parents[1]
SYLLABUS = json.loads((ROOT / "clusterlab/data/syllabus.json").read_text())
LABS = all_labs()
COURSE_LABS = sorted(lab for lab in LABS if not lab.startswith("99_"))
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]*_*.ipynb"))


def test_at_least_eight_labs_each_with_a_solution_and_a_lab():
    assert len(COURSE_LABS) >= 8, COURSE_LABS
    assert [p.stem for p in SOLUTIONS] == COURSE_LABS
    assert sorted(p.stem for p in (ROOT / "labs").glob("*.ipynb")) == COURSE_LABS


def test_labs_are_exactly_what_the_generator_writes():
    files = build(ROOT, write=False)
    for rel, text in files.items():
        assert (ROOT / rel).read_text() == text, (
            f"{rel} differs from what `clusterlab labs build` writes: edit solutions/, "
            "never labs/, then run it")


def _solution_lines(nb) -> set[str]:
    inside, outside = set(), set()
    for cell in nb.cells:
        mine = False
        for line in cell.source.split("\n"):
            if BEGIN in line:
                mine = True
            elif END in line:
                mine = False
            elif line.strip() and not TASK.match(line):
                (inside if mine else outside).add(line.strip())
    # Lines short or common enough to appear elsewhere in the notebook are not evidence.
    return {x for x in inside - outside if len(x) >= 12 and not x.startswith("#")}


@pytest.mark.parametrize("lab", COURSE_LABS)
def test_no_solution_text_in_the_lab(lab):
    solved = nbformat.read(ROOT / "solutions" / f"{lab}.ipynb", as_version=4)
    shipped = (ROOT / "labs" / f"{lab}.ipynb").read_text()
    lines = _solution_lines(solved)
    assert lines, f"{lab}: no solution blocks found"
    cells = nbformat.reads(shipped, as_version=4).cells
    # A leak is a solution line the lab runs as code. (The TODO comments and the prose may
    # quote a call on purpose: that is the instruction, e.g. "pair rank r with r ^ step".)
    code = {line.strip() for c in cells if c.cell_type == "code"
            for line in c.source.split("\n") if not line.strip().startswith("#")}
    leaked = sorted(lines & code)
    assert not leaked, f"{lab}: solution lines in labs/: {leaked[:3]}"
    assert "### BEGIN SOLUTION" not in shipped and all(not c.get("outputs") for c in cells)


@pytest.mark.parametrize("lab", COURSE_LABS)
def test_each_lab_follows_its_notebook_which_links_to_it(lab):
    follows = LABS[lab].follows
    assert SYLLABUS[follows].get("lab") == lab, f"syllabus.json: {follows} should name {lab}"
    nb = nbformat.read(ROOT / "notebooks" / f"{follows}.ipynb", as_version=4)
    assert f"../labs/{lab}.ipynb" in nb.cells[-1].source, (
        f"the last cell of {follows} should link to ../labs/{lab}.ipynb")


@pytest.mark.parametrize("lab", COURSE_LABS)
def test_graded_cells_carry_nbgrader_metadata_and_registry_points(lab):
    nb = nbformat.read(ROOT / "labs" / f"{lab}.ipynb", as_version=4)
    graded = [c.metadata["nbgrader"] for c in nb.cells if c.metadata.get("nbgrader", {})
              .get("grade")]
    assert sum(g["points"] for g in graded) == LABS[lab].points
    assert any(c.metadata.get("nbgrader", {}).get("solution") for c in nb.cells)
    ids = [c["id"] for c in nb.cells]
    assert len(ids) == len(set(ids))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_shipped_lab_fails_every_check_as_not_implemented(no_leftovers):
    rows = grade([ROOT / "labs" / f"{lab}.ipynb" for lab in COURSE_LABS], timeout=120,
                 jobs=2)
    for row in rows:
        assert row["status"] == "graded", (row["path"], row["status"], row["note"])
        assert row["earned"] == 0
        wrong = [(c["check"], c["status"], c["message"]) for c in row["checks"]
                 if c["status"] != "todo" or "not implemented yet" not in c["message"]]
        assert not wrong, f"{row['lab']}: {wrong[:3]}"
        assert re.search(r"TODO", (ROOT / row["path"]).read_text())
