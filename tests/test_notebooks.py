"""The course's notebooks: structure against the syllabus, hygiene, and the Binder setup.

nbval itself (every notebook executed and compared) runs from test.sh; these tests check
what nbval does not: headings, committed outputs, paths, and a fresh Binder environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYLLABUS = json.loads((ROOT / "clusterlab/data/syllabus.json").read_text())
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
MACHINE_PATH = re.compile(r"(/work/|/tmp/|/root/|/home/\w+/)")


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def test_every_notebook_is_in_the_syllabus():
    assert NOTEBOOKS, "no notebooks found"
    for nb in NOTEBOOKS:
        assert nb.stem in SYLLABUS, f"{nb.name} is not in clusterlab/data/syllabus.json"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_sections_match_the_syllabus(nb):
    headings = []
    for cell in cells(nb):
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            headings += [m.strip() for m in re.findall(r"^##\s+(.+)$", text, flags=re.M)]
    missing = [s for s in SYLLABUS[nb.stem]["sections"] if s not in headings]
    assert not missing, f"{nb.name} lacks sections {missing}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_with_clean_outputs(nb):
    code = [c for c in cells(nb) if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert code and all(c.get("execution_count") for c in code), "commit it executed"
    for c in code:
        for out in c.get("outputs", []):
            assert out.get("output_type") != "error", f"{nb.name}: a stored error output"
            text = json.dumps(out.get("text", "")) + json.dumps(out.get("data", {}).get(
                "text/plain", ""))
            assert not MACHINE_PATH.search(text), f"{nb.name}: a machine path in an output"


# About 2,500 words of prose per notebook (at most three ideas): past that learners lose the
# thread. Prose is the markdown plus the text the ledger renders into "On a real GPU cluster".
WORDS = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")
WORD_BUDGET = 2600


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_is_short_enough_to_follow(nb):
    words = sum(len(WORDS.findall("".join(c["source"]))) for c in cells(nb)
                if c["cell_type"] == "markdown")
    assert words <= WORD_BUDGET, (f"{nb.name}: {words} words of markdown; split it or trim "
                                  f"it to about 2,500 (budget {WORD_BUDGET})")


# A code cell a learner reads at a glance: the experiment call, the number the text is about,
# the figure, the verdicts. Bookkeeping, sentence formatting and checks live in the notebook's
# lesson module (clusterlab/lessons/), where they are tested.
CELL_LINES = 20


def significant_lines(source: str) -> int:
    return sum(1 for line in source.splitlines()
               if line.strip() and not line.strip().startswith("#"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_code_cells_are_short_calls_not_machinery(nb):
    for i, c in enumerate(cells(nb)):
        if c["cell_type"] != "code":
            continue
        source = "".join(c["source"])
        lines = significant_lines(source)
        assert lines <= CELL_LINES, (f"{nb.name} cell {i}: {lines} lines of code; move what "
                                     "is not the story into its lesson module")
        assert not re.search(r"^\s*(def|class)\s", source, flags=re.M), (
            f"{nb.name} cell {i} defines a function or class; it belongs in the lesson module")


@pytest.mark.parametrize("nb", [p for p in NOTEBOOKS if p.stem != "09_interview_rehearsal"],
                         ids=lambda p: p.stem)
def test_a_notebook_says_what_carries_over_to_a_real_gpu_cluster(nb):
    """Each topic ends with "On a real GPU cluster", its constants cited from the ledger."""
    sources = ["".join(c["source"]) for c in cells(nb)]
    assert any(re.search(r"^##\s+On a real GPU cluster\s*$", s, flags=re.M) for s in sources), (
        f"{nb.name} has no '## On a real GPU cluster' section")
    assert any("facts.show(" in s for s in sources), (
        f"{nb.name}: its real-cluster section cites nothing from the ledger (facts.show)")


PNG_DPI = re.compile(rb"pHYs(.{4})(.{4})\x01", re.S)
LABS_SOLVED = sorted((ROOT / "solutions").glob("[0-9][0-9]*_*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS + LABS_SOLVED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_figures_are_stored_at_100_dpi_or_more(nb):
    import base64
    import struct

    for index, cell in enumerate(cells(nb)):
        for out in cell.get("outputs", []):
            png = out.get("data", {}).get("image/png")
            if not png:
                continue
            found = PNG_DPI.search(base64.b64decode(png))
            assert found, f"{nb.name} cell {index}: a PNG without its resolution"
            dpi = struct.unpack(">I", found.group(1))[0] * 0.0254
            assert dpi >= 99.5, f"{nb.name} cell {index}: a figure at {dpi:.0f} dpi (< 100)"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_binder_files_alone_build_an_environment_that_runs_start_here(tmp_path):
    """A fresh venv from binder/requirements.txt + binder/postBuild executes 00_start_here."""
    venv = tmp_path / "binder-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {**os.environ, "PIP_RETRIES": "0", "PIP_DEFAULT_TIMEOUT": "5",
           "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["-r", "binder/requirements.txt"], cwd=ROOT, env=env, check=True,
                   timeout=900)
    subprocess.run(["bash", "binder/postBuild"], cwd=ROOT, env=env, check=True, timeout=300)
    torch_build = subprocess.run(
        [str(venv / "bin/python"), "-c", "import torch; print(torch.__version__)"],
        env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert torch_build.endswith("+cpu"), f"Binder would get torch {torch_build}, not a CPU build"
    out = tmp_path / "executed.ipynb"
    subprocess.run([str(venv / "bin/jupyter"), "nbconvert", "--to", "notebook", "--execute",
                    "--ExecutePreprocessor.timeout=300", "--output", str(out),
                    str(ROOT / "notebooks/00_start_here.ipynb")],
                   cwd=ROOT, env=env, check=True, timeout=600)
    errors = [o for c in cells(out) for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
