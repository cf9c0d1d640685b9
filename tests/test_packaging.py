"""Conventions of the package: one version, a licence that matches, Binder pinned like the
course."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line (a local build tag like +cpu dropped)."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;#+]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


# Pinned on Binder only: repo2docker installs them itself, in versions that may not accept
# the course's pins; the course does not use them.
BINDER_ONLY = {"notebook"}


def test_binder_pins_the_same_versions_as_the_course():
    course, binder = pins(ROOT / "requirements.txt"), pins(ROOT / "binder/requirements.txt")
    assert course, "requirements.txt pins nothing"
    assert binder.keys() >= BINDER_ONLY and not BINDER_ONLY & course.keys()
    binder = {k: v for k, v in binder.items() if k not in BINDER_ONLY}
    assert binder == course, {k: (course.get(k), binder.get(k))
                              for k in course.keys() | binder.keys()
                              if course.get(k) != binder.get(k)}
    assert re.search(r"^torch==[\d.]+\+cpu$", (ROOT / "binder/requirements.txt").read_text(),
                     flags=re.M), "Binder must ask for the CPU build of torch"


def test_binders_notebook_accepts_its_jupyterlab():
    """repo2docker's base environment has notebook 7 beside the JupyterLab that
    binder/requirements.txt upgrades; notebook 7.N requires jupyterlab 4.N (7.6.5:
    jupyterlab>=4.6.6,<4.7), so an unpinned or older notebook is a pip conflict in the build."""
    binder = pins(ROOT / "binder/requirements.txt")
    lab = tuple(int(x) for x in binder["jupyterlab"].split("."))
    notebook = tuple(int(x) for x in binder["notebook"].split("."))
    assert lab[0] == 4 and notebook[:2] == (7, lab[1]), (binder["notebook"], binder["jupyterlab"])


def test_the_version_is_defined_once():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project.get("dynamic", [])
    import clusterlab

    installed = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('clusterlab'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert installed == clusterlab.__version__


def test_the_licence_file_matches_pyproject():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]["text"]
    text = (ROOT / "LICENSE").read_text()
    assert declared == "MIT" and text.startswith("MIT License")
    assert "Permission is hereby granted, free of charge" in text


# Import names that differ from the distribution that provides them.
DISTRIBUTION_OF = {"IPython": "ipython", "PIL": "pillow"}


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level module -> files of clusterlab/ that import it (absolute imports only; the
    standard library and clusterlab itself left out)."""
    import ast

    found: dict[str, set[str]] = {}
    for path in (ROOT / "clusterlab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "clusterlab":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_declared():
    """An installed wheel has only what pyproject declares: `grade` crashed on nbformat."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = set()
    for spec in project["dependencies"] + [d for extra in project.get(
            "optional-dependencies", {}).values() for d in extra]:
        declared.add(re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0].lower().replace("_", "-"))
    imports = _third_party_imports()
    assert {"torch", "numpy", "nbformat"} <= imports.keys()  # the scan sees what it should
    missing = {mod: sorted(files) for mod, files in imports.items()
               if DISTRIBUTION_OF.get(mod, mod).lower().replace("_", "-") not in declared}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
