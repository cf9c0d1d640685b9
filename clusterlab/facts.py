"""The ledger of external facts: every constant or behaviour of real systems the course states.

A default timeout, a bucket size, an RTO floor, an NVLink or NIC bandwidth, the list of NCCL's
algorithms: each lives once, in `clusterlab/data/facts/*.toml`, with the primary source it
was read from and the version it holds for. Notebooks and questions take such values from
here instead of typing them, so a fact corrected here is corrected everywhere, and
`tests/test_facts.py` fails on a real-system constant stated anywhere else.

An entry::

    [pytorch.nccl_timeout_default]    # the id: "<system>.<what>", lower case
    value = 10                        # a number, or a string for a name or a list
    unit = "min"                      # optional; printed after the value
    says = "ProcessGroupNCCL's default timeout for collectives"
    holds_for = "PyTorch >= 2.2"      # the versions or hardware the value is true for
    source = "https://github.com/pytorch/pytorch/pull/110947"
    source_title = "pytorch/pytorch#110947: change ProcessGroupNCCL default timeout to 10 min"

In a notebook, a code cell renders prose whose constants come from here::

    from clusterlab import facts
    facts.show("NCCL gives up on a collective after [[pytorch.nccl_timeout_default]], Gloo "
               "after [[pytorch.gloo_timeout_default]].")

`[[id]]` becomes the value with its unit and a numbered citation; the sources follow the
text, each with the version it holds for. `[[id|value]]` gives the bare value (for arithmetic
in a sentence), `[[id|says]]` the description. (Double brackets, so that f-strings and
str.format in the same cell are left alone.) `facts.get(id).value` is the number for code.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

LEDGER_DIR = Path(__file__).resolve().parent / "data" / "facts"
ID = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
PLACEHOLDER = re.compile(r"\[\[([a-z0-9_]+(?:\.[a-z0-9_]+)+)(?:\|(value|says))?\]\]")
REQUIRED = ("value", "says", "holds_for", "source", "source_title")


@dataclass(frozen=True)
class Fact:
    """One external fact: what it says, its value, and where and for what it holds."""

    id: str
    value: float | int | str
    says: str
    holds_for: str
    source: str
    source_title: str
    unit: str = ""
    note: str = ""

    @property
    def text(self) -> str:
        """The value as a sentence states it: '10 min', '25 MiB', 'Ring, Tree'."""
        value = self.value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return f"{value} {self.unit}".strip() if self.unit else str(value)


def _check(fact_id: str, entry: dict, where: Path) -> Fact:
    if not ID.match(fact_id):
        raise ValueError(f"{where.name}: fact id {fact_id!r} is not '<system>.<what>' in "
                         "lower case")
    missing = [k for k in REQUIRED if k not in entry]
    if missing:
        raise ValueError(f"{where.name}: fact {fact_id!r} lacks {', '.join(missing)}")
    unknown = set(entry) - set(REQUIRED) - {"unit", "note"}
    if unknown:
        raise ValueError(f"{where.name}: fact {fact_id!r} has unknown keys {sorted(unknown)}")
    if not str(entry["source"]).startswith("https://"):
        raise ValueError(f"{where.name}: fact {fact_id!r}: source must be an https:// address")
    return Fact(id=fact_id, **entry)


def _flatten(table: dict, prefix: str = "") -> dict[str, dict]:
    """TOML nests dotted keys ([nccl.timeout_default] is nccl -> timeout_default)."""
    out: dict[str, dict] = {}
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and "says" not in value:
            out.update(_flatten(value, name))
        else:
            out[name] = value
    return out


@cache
def ledger() -> dict[str, Fact]:
    """Every fact, by id, from all ledger files (an id defined twice is an error)."""
    facts: dict[str, Fact] = {}
    for path in sorted(LEDGER_DIR.glob("*.toml")):
        for fact_id, entry in _flatten(tomllib.loads(path.read_text())).items():
            if fact_id in facts:
                raise ValueError(f"fact {fact_id!r} is defined twice (again in {path.name})")
            facts[fact_id] = _check(fact_id, entry, path)
    return facts


def get(fact_id: str) -> Fact:
    """One fact by id; an unknown id names the closest ones."""
    facts = ledger()
    if fact_id not in facts:
        import difflib

        near = difflib.get_close_matches(fact_id, facts, n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise KeyError(f"no fact {fact_id!r} in the ledger (clusterlab/data/facts){hint}")
    return facts[fact_id]


def render(template: str, *, sources: bool = True, one_per_source: bool = False,
           fold_sources: bool = False) -> str:
    """Markdown: each `[[id]]` replaced by its value and a numbered citation, sources listed.

    one_per_source=True numbers sources, not facts: facts read from the same page share one
    number and one line (its title without the per-fact detail, every version it holds for).
    fold_sources=True keeps the list behind a fold titled "Sources (N)" that the reader clicks
    open: a long list would otherwise bury the few sentences it backs.
    """
    cited: list[Fact] = []
    numbers: dict[str, int] = {}

    def number(fact: Fact) -> int:
        key = fact.source if one_per_source else fact.id
        if key not in numbers:
            numbers[key] = len(numbers) + 1
        return numbers[key]

    def replace(m: re.Match) -> str:
        fact = get(m[1])
        if m[2] == "value":
            return fact.text.removesuffix(fact.unit).strip() if fact.unit else fact.text
        if m[2] == "says":
            return fact.says
        if fact not in cited:
            cited.append(fact)
        return f"{fact.text}<sup>[{number(fact)}]</sup>"

    body = PLACEHOLDER.sub(replace, template)
    if not (sources and cited):
        return body
    groups: dict[int, list[Fact]] = {}
    for f in cited:
        groups.setdefault(number(f), []).append(f)
    lines = []
    for i, group in sorted(groups.items()):
        titles = list(dict.fromkeys(f.source_title for f in group))
        title = titles[0] if len(titles) == 1 else titles[0].split(" (")[0]
        holds = "; ".join(dict.fromkeys(f.holds_for for f in group))
        lines.append(f"{i}. [{title}]({group[0].source}) — holds for {holds}")
    listed = "\n".join(lines)
    if fold_sources:
        return (body.rstrip() + f"\n\n<details><summary>Sources ({len(lines)})</summary>\n\n"
                f"<small>\n\n{listed}\n\n</small>\n\n</details>\n")
    return body.rstrip() + "\n\n<small>\n\n**Sources**\n\n" + listed + "\n\n</small>\n"


def show(template: str, *, one_per_source: bool = False, fold_sources: bool = False) -> None:
    """Display `render(template)` as Markdown in a notebook."""
    from IPython.display import Markdown, display

    display(Markdown(render(template, one_per_source=one_per_source,
                            fold_sources=fold_sources)))


def placeholders(text: str) -> list[str]:
    """The fact ids a template names (for tests)."""
    return [m[1] for m in PLACEHOLDER.finditer(text)]
