"""No measured figure is typed in a notebook's markdown.

A sentence that states a result must be printed by the code that measured it. So a markdown
cell of notebooks/ or solutions/ may state a figure (a number with a unit of time, rate, size,
a percentage or a ratio) only when it is

- code: inside `code spans`, fenced code or $math$;
- a configured input: the same number with the same unit is written in the notebook's code
  (`delay 2ms` allows "2 ms"; `compute_ms=50` allows "50 ms");
- a worked derivation: its sentence has an arithmetic operator and "=" or "≈" ("6 rounds ×
  2 ms = 12 ms" derives a prediction in the open);
- the premise of a question: a `## Self-check` cell or a **Predict first.** prompt, outside
  its answer (`<details>`);
- a lab's planned duration ("Time: about 45 minutes.");
- a constant of a real system from the ledger of external facts (clusterlab/data/facts), with
  its unit (tests/test_facts.py checks that such constants come from there);
- a reviewed definition in tests/data/markdown_figures.json: "figures" anywhere, "scoped" in
  the one notebook named (e.g. a lab check's tolerance, defined in its module).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")) + sorted(
    (ROOT / "solutions").glob("[0-9][0-9]*_*.ipynb"))
ALLOWED = json.loads((ROOT / "tests/data/markdown_figures.json").read_text())

# Unit spellings, by family; code writes the same quantity in netem or Python spellings.
UNITS = {
    "ns": "ns", "µs": "us", "μs": "us", "us": "us", "usec": "us", "ms": "ms", "msec": "ms",
    "s": "s", "sec": "s", "seconds": "s", "second": "s", "min": "min", "minutes": "min",
    "%": "%", "×": "x", "x": "x",
    "bit/s": "bit/s", "kbit/s": "kbit/s", "Mbit/s": "mbit/s", "Gbit/s": "gbit/s",
    "kbit": "kbit/s", "mbit": "mbit/s", "gbit": "gbit/s", "Mb/s": "mbit/s", "Gb/s": "gbit/s",
    "B/s": "B/s", "KB/s": "KB/s", "MB/s": "MB/s", "GB/s": "GB/s", "MiB/s": "MiB/s",
    "GiB/s": "GiB/s",
    "B": "B", "bytes": "B", "KB": "KB", "kB": "KB", "MB": "MB", "GB": "GB", "KiB": "KiB",
    "MiB": "MiB", "GiB": "GiB", "kib": "KiB", "mib": "MiB", "gib": "GiB",
}
_UNIT_RE = "|".join(sorted((re.escape(u) for u in UNITS if u not in ("×", "x")), key=len,
                           reverse=True))
NUMBER = r"(?<![\w.^/])(?P<value>\d+(?:[.,]\d+)?)(?:\s*[kK](?=\s*\w+/s))?"
# "2.3×" and "2.3x" are ratios; "6 × 2 ms" is an operator.
FIGURE = re.compile(NUMBER + r"(?:\s*(?P<ratio>×)(?!\s*[\d(αβγnpN])|(?P<ratio2>x)(?![\w\d(])"
                    r"|\s*(?P<unit>" + _UNIT_RE + r"|[A-Za-z.]+/s)(?![\w/]))")
OPERATOR = re.compile(r"\s[×·÷+−]\s|[\w)]\s*[×·*÷+−]\s*[\d(αβγ]|[\d)p]\s*/\s*[\d(p]|\d\s*-\s*\d")
DERIVES = re.compile(r"[=≈]")
CODE = re.compile(r"```.*?```|`[^`]*`|\$\$.*?\$\$|\$[^$\n]*\$", re.S)
DETAILS = re.compile(r"<details>.*?</details>", re.S)
PROMPT = re.compile(r"\*\*Predict first\.?\*\*.*?(?=<details>|\Z)", re.S)
SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+(?=[A-Z*(_\d])|\n\s*\n|\n\s*[-*\d]+[.)]?\s")


# Each unit family's size in its dimension's base unit (seconds, bit/s, bytes).
SCALE = {
    "ns": ("time", 1e-9), "us": ("time", 1e-6), "ms": ("time", 1e-3), "s": ("time", 1.0),
    "min": ("time", 60.0), "bit/s": ("rate", 1.0), "kbit/s": ("rate", 1e3),
    "mbit/s": ("rate", 1e6), "gbit/s": ("rate", 1e9), "B/s": ("rate", 8.0),
    "KB/s": ("rate", 8e3), "MB/s": ("rate", 8e6), "GB/s": ("rate", 8e9),
    "MiB/s": ("rate", 8.0 * 2**20), "GiB/s": ("rate", 8.0 * 2**30), "B": ("size", 1.0),
    "KB": ("size", 1e3), "MB": ("size", 1e6), "GB": ("size", 1e9), "KiB": ("size", 1024.0),
    "MiB": ("size", 2.0**20), "GiB": ("size", 2.0**30),
}


def unit_family(unit: str) -> str:
    return UNITS.get(unit, UNITS.get(unit.lower(), unit))


def unit_of(m: re.Match) -> str:
    return m["unit"] or m["ratio"] or m["ratio2"]


def number(text: str) -> float:
    return float(text.replace(",", "."))


def quantity(value: float, unit: str) -> tuple[str, float]:
    """(dimension, value in its base unit), so that 10 ms and compute_s=0.010 compare equal."""
    family = unit_family(unit)
    dim, scale = SCALE.get(family, (family, 1.0))
    return dim, float(f"{value * scale:.9g}")


def lesson_module(path: Path) -> Path:
    """The module a notebook reads its runs with: notebooks/06b_lock_free_updates.ipynb ->
    clusterlab/lessons/lock_free_updates.py (it may not exist)."""
    return ROOT / "clusterlab/lessons" / (re.sub(r"^\d+[a-z]?_", "", path.stem) + ".py")


def code_inputs(cells: list[dict], path: Path | None = None) -> set[tuple[str, float]]:
    """The quantities written in the notebook's code - its cells and, given the notebook's
    `path`, its lesson module: netem strings, `name_<unit>=value` keywords, dilation
    factors."""
    found: set[tuple[str, float]] = set()
    num = r"(\d+(?:\.\d+)?(?:e-?\d+)?)"
    sources = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]
    if path is not None and path.parent.name == "notebooks" and lesson_module(path).exists():
        sources.append(lesson_module(path).read_text())
    for src in sources:
        for m in re.finditer(r"(?<![\w.])" + num + r"\s*(" + _UNIT_RE + r")(?![A-Za-z])", src):
            found.add(quantity(float(m.group(1)), m.group(2)))
        for m in re.finditer(r"\b\w*?_(ns|us|ms|s|mib|kib|gib|mb|pct|percent)\s*[=:]\s*" + num,
                             src, flags=re.I):
            unit = {"pct": "%", "percent": "%", "mb": "MB"}.get(m.group(1).lower(), m.group(1))
            found.add(quantity(float(m.group(2)), unit))
        for m in re.finditer(r"\bdilation\s*=\s*" + num, src, flags=re.I):
            found.add(quantity(float(m.group(1)), "x"))
    return found


def ledger_quantities() -> set[tuple[str, float]]:
    """The ledger's numeric facts with units, as (dimension, base value)."""
    from clusterlab import facts

    return {quantity(float(f.value), f.unit) for f in facts.ledger().values()
            if isinstance(f.value, (int, float)) and f.unit}


def figures(text: str):
    """(figure text, sentence) for every figure in a markdown text outside code and math."""
    prose = CODE.sub(" ", text)
    for sentence in SENTENCE_END.split(prose):
        yield from ((m, sentence) for m in FIGURE.finditer(sentence))


def is_derivation(sentence: str) -> bool:
    return bool(OPERATOR.search(CODE.sub(" ", sentence)) and DERIVES.search(sentence))


def violations(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    inputs = code_inputs(cells, path) | ledger_quantities()
    name = f"{path.parent.name}/{path.name}"
    allowed = set(ALLOWED["figures"]) | {key.split(": ", 1)[1] for key in ALLOWED["scoped"]
                                         if key.split(": ", 1)[0] == name}
    bad = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        if re.match(r"\s*##\s+Self-check", text):
            # A question states its premises; only its answers are checked.
            text = " ".join(DETAILS.findall(text))
        text = PROMPT.sub(" ", text)
        for m, sentence in figures(text):
            shown = " ".join(m.group(0).split())
            family = unit_family(unit_of(m))
            value = quantity(number(m["value"]), unit_of(m))
            planned = family == "min" and sentence.lstrip().startswith("Time")
            if (value in inputs or shown in allowed or planned
                    or is_derivation(sentence)):
                continue
            context = " ".join(sentence.split())[:140]
            bad.append(f"{name} cell {index}: {shown!r} in {context!r}")
    return bad


def test_the_allow_list_is_short_and_reasoned():
    entries = {**ALLOWED["figures"], **ALLOWED["scoped"]}
    assert len(entries) <= 60, "the allow-list is for definitions and constants, not results"
    for figure, reason in entries.items():
        assert FIGURE.search(figure), f"{figure!r} is not a figure this test would flag"
        assert len(reason.split()) >= 3, f"{figure!r} needs a reason"
    for key in ALLOWED["scoped"]:
        assert (ROOT / key.split(": ", 1)[0]).exists(), f"{key!r} names no notebook"


def test_the_rule_catches_typed_results_and_spares_inputs_and_derivations():
    nb = {"cells": [
        {"cell_type": "code", "source": ['Cluster(nic="delay 2ms rate 1gbit", compute_ms=50)']},
        {"cell_type": "markdown", "source": [
            "Each NIC adds 2 ms and 50 ms of compute. Six rounds × 2 ms = 12 ms of latency. "
            "The run shows ≈ 10 ms of forward and backward, 2.3× slower, `delay 5ms`, "
            "and 27k updates/s."]},
        {"cell_type": "markdown", "source": [
            "## Self-check\n\n1. A step is 30 ms?\n\n<details>It takes 41 ms.</details>"]},
        {"cell_type": "markdown", "source": [
            "**Predict first.** One rank takes 40 ms: the step?\n\n<details>About 45 ms."
            "</details>"]},
    ]}
    path = ROOT / "tests/data/_figures_probe.ipynb"
    path.write_text(json.dumps(nb))
    try:
        found = violations(path)
    finally:
        path.unlink()
    flagged = [line.split(": ", 1)[1].split(" in ")[0] for line in found]
    assert flagged == ["'10 ms'", "'2.3×'", "'27k updates/s'", "'41 ms'",
                       "'45 ms'"], found


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_typed_figures_in_markdown(nb):
    bad = violations(nb)
    assert not bad, ("figures typed in markdown (print them from the run, make them "
                     "qualitative, or derive them in the open):\n" + "\n".join(bad))
