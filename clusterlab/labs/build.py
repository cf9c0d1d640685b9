"""Generate the learner's labs/ from the solved sources in solutions/ (one source, two outputs).

Conventions (nbgrader's, so an instructor can also use nbgrader on solutions/):

- In a code cell, the lines between `### BEGIN SOLUTION` and `### END SOLUTION` are the
  answer. In the lab they become `raise NotImplementedError(...)` at the block's
  indentation. The instructions are `# TASK:` comment lines just above the block, outside
  it (so nbgrader's generate_assignment keeps them); the lab shows them as `# TODO:`.
- In a markdown cell, the block becomes "_Your answer here._".
- A code cell that calls `check("exercise")` is a graded cell; its points are the
  exercise's points in `clusterlab.labs` (the registry is the single source of points).
- Cells with a solution block are nbgrader solution cells. Both notebooks get nbgrader
  metadata and stable cell ids; the lab's outputs are cleared.

`build()` rewrites solutions/ metadata in place (idempotent) and writes labs/.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import nbformat

from . import all_labs

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
TASK = re.compile(r"^(\s*)# TASK:?\s?(.*)$")
CHECK_CALL = re.compile(r"""\bcheck\(\s*["']([\w.-]+)["']""")
ANSWER_PLACEHOLDER = "_Your answer here._"
SCHEMA_VERSION = 3


def _blocks(lines: list[str], where: str) -> list[tuple[int, int]]:
    """(begin, end) line indices of each solution block; a clear error for unbalanced ones."""
    out, start = [], None
    for i, line in enumerate(lines):
        if BEGIN in line:
            if start is not None:
                raise ValueError(f"{where}: '{BEGIN}' at line {i + 1} inside another block")
            start = i
        elif END in line:
            if start is None:
                raise ValueError(f"{where}: '{END}' at line {i + 1} without a BEGIN")
            out.append((start, i))
            start = None
    if start is not None:
        raise ValueError(f"{where}: '{BEGIN}' at line {start + 1} is never closed")
    return out


DEF = re.compile(r"^(\s*)(?:async\s+)?(def|class)\s+(\w+)")


def _enclosing(lines: list[str], begin: int) -> str | None:
    """'Class.method' or 'function' whose body holds line `begin` (None at top level)."""
    depth = len(lines[begin]) - len(lines[begin].lstrip())
    names = []
    for line in reversed(lines[:begin]):
        m = DEF.match(line)
        if m and len(m.group(1)) < depth:
            names.append(m.group(3))
            depth = len(m.group(1))
    return ".".join(reversed(names)) or None


def _todo(line: str) -> str:
    """A `# TASK:` line as the lab shows it (`# TODO:`); any other line unchanged."""
    m = TASK.match(line)
    return f"{m.group(1)}# TODO: {m.group(2)}" if m else line


def _strip_code(source: str, cell_id: str, where: str) -> str:
    lines = source.split("\n")
    blocks = _blocks(lines, where)
    out, last = [], 0
    for begin, end in blocks:
        # The task lines sit just above the block, outside it, so that nbgrader's
        # generate_assignment, which replaces the block, keeps them too.
        out += [_todo(x) for x in lines[last:begin]]
        if any(TASK.match(x) for x in lines[begin + 1 : end]):
            raise ValueError(f"{where}: a '# TASK:' line inside the solution block at line "
                             f"{begin + 1}: put it above '{BEGIN}' (nbgrader deletes the block)")
        indent = re.match(r"\s*", lines[begin]).group(0)
        name = _enclosing(lines, begin)
        todo = f"{name} is not written yet" if name else f"cell {cell_id}: your code here"
        out.append(f'{indent}raise NotImplementedError("{todo}")')
        last = end + 1
    out += [_todo(x) for x in lines[last:]]
    return "\n".join(out)


def _strip_markdown(source: str, where: str) -> str:
    lines = source.split("\n")
    out, last = [], 0
    for begin, end in _blocks(lines, where):
        out += lines[last:begin] + [ANSWER_PLACEHOLDER]
        last = end + 1
    out += lines[last:]
    return "\n".join(out)


def _nbgrader(grade_id: str, *, solution: bool, grade: bool, points: int | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": not solution,
            "schema_version": SCHEMA_VERSION, "solution": solution, "task": False}
    if grade:
        meta["points"] = points
    return meta


def annotate(nb: nbformat.NotebookNode, lab_id: str) -> nbformat.NotebookNode:
    """Give a solved notebook its nbgrader metadata and stable cell ids (in place)."""
    labs = all_labs()
    if lab_id not in labs:
        raise ValueError(f"notebook metadata names lab {lab_id!r}, which clusterlab.labs "
                         f"does not define (known: {', '.join(sorted(labs))})")
    exercises = {ex.id: ex for ex in labs[lab_id].exercises}
    used_ids: set[str] = set()
    for i, cell in enumerate(nb.cells):
        src = cell.source
        meta = cell.metadata
        meta.pop("nbgrader", None)
        called = CHECK_CALL.findall(src) if cell.cell_type == "code" else []
        if BEGIN in src or END in src:
            _blocks(src.split("\n"), f"{lab_id} cell {i}")  # unbalanced markers: an error
            gid = meta.get("clusterlab_id") or f"{lab_id}-answer-{i}"
            meta["nbgrader"] = _nbgrader(gid, solution=True, grade=False)
        elif called:
            unknown = [c for c in called if c not in exercises]
            if unknown:
                raise ValueError(f"{lab_id} cell {i}: check({unknown[0]!r}) is not an exercise "
                                 f"of this lab (its exercises: {', '.join(exercises)})")
            gid = "check-" + "-".join(called)
            points = sum(exercises[c].points for c in called)
            meta["nbgrader"] = _nbgrader(gid, solution=False, grade=True, points=points)
        else:
            gid = f"cell-{i}"
        gid = re.sub(r"[^A-Za-z0-9_-]", "-", gid)
        if gid in used_ids:
            raise ValueError(f"{lab_id}: two cells would have the id {gid!r}")
        used_ids.add(gid)
        cell["id"] = gid
    missing = [e for e in exercises if not any(
        e in CHECK_CALL.findall(c.source) for c in nb.cells if c.cell_type == "code")]
    if missing:
        raise ValueError(f"{lab_id}: no cell calls check() for {', '.join(missing)}")
    return nb


def to_lab(solved: nbformat.NotebookNode, lab_id: str) -> nbformat.NotebookNode:
    """The learner's version of an annotated solved notebook."""
    nb = copy.deepcopy(solved)
    for i, cell in enumerate(nb.cells):
        where = f"{lab_id} cell {i}"
        if BEGIN in cell.source:
            if cell.cell_type == "code":
                cell.source = _strip_code(cell.source, cell["id"], where)
            else:
                cell.source = _strip_markdown(cell.source, where)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)  # run timestamps: the lab must be reproducible
    nb.metadata.pop("widgets", None)
    nb.metadata.get("clusterlab", {})["generated_from"] = "solutions (clusterlab labs build)"
    return nb


def lab_id_of(nb: nbformat.NotebookNode) -> str | None:
    return nb.metadata.get("clusterlab", {}).get("lab")


def _dump(nb: nbformat.NotebookNode) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def build(root: Path, *, write: bool = True, only: str | None = None) -> dict[str, str]:
    """Annotate solutions/*.ipynb and generate labs/*.ipynb (or just lab `only`). Returns
    {relative path: text} of every file it would write; write=False changes nothing."""
    root = Path(root)
    sources = sorted((root / "solutions").glob(f"{only or '[0-9][0-9]_*'}.ipynb"))
    if not sources:
        raise ValueError(f"no solved labs in {root / 'solutions'}")
    files: dict[str, str] = {}
    for path in sources:
        nb = nbformat.read(path, as_version=4)
        lab_id = lab_id_of(nb)
        if lab_id is None:
            raise ValueError(f"{path.name}: notebook metadata has no clusterlab.lab")
        if lab_id != path.stem:
            raise ValueError(f"{path.name}: its metadata names lab {lab_id!r}; the file must "
                             f"be called {lab_id}.ipynb")
        annotate(nb, lab_id)
        files[f"solutions/{path.name}"] = _dump(nb)
        files[f"labs/{path.name}"] = _dump(to_lab(nb, lab_id))
    if write:
        (root / "labs").mkdir(exist_ok=True)
        for rel, text in files.items():
            target = root / rel
            if not target.exists() or target.read_text() != text:
                target.write_text(text)
        stale = {p.name for p in (root / "labs").glob("*.ipynb")} - {
            Path(r).name for r in files if r.startswith("labs/")}
        for name in stale if only is None else ():
            (root / "labs" / name).unlink()
    return files
