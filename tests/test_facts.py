"""The ledger of external facts (clusterlab/data/facts) and its use by the course.

A constant of a real system (a default timeout, a bandwidth, an RTO floor) is stated in one
place, the ledger, with its source and the version it holds for. These tests fail when

- a ledger entry lacks its source, its version, or is defined twice;
- a notebook, solved lab or question names a fact id the ledger does not have;
- a sentence about a real system (NCCL, NVLink, InfiniBand, Linux TCP, PyTorch, ...) in a
  notebook's markdown or in the question bank states a figure that is neither a ledger value
  (with its unit), a configured input of the notebook's own code, nor the result of a
  derivation written out in the sentence. Question premises ("Self-check", "Predict first")
  are hypotheses and are not checked.

In the question bank a question's own text states its premises ("one GPU is 20% slower",
"a 100 Gbit/s NIC"): they are hypotheses, not claims, so its text is not checked and the
figures it states may be used again in its options, explanations and answers, as a
notebook's configured inputs may. Unit definitions ("1 GB = 10⁹ bytes") and products with a
template placeholder ("6 × {P}") are not constants either. A figure about a real system that
a question states in its answers without having posed it (a Linux RTO floor, DDP's bucket
size, the NICs of a GPU node) must still be a ledger value.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_markdown_figures import (
    ALLOWED,
    CODE,
    DETAILS,
    PROMPT,
    code_inputs,
    figures,
    ledger_quantities,
    number,
    quantity,
    unit_of,
)

from clusterlab import facts

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")) + sorted(
    (ROOT / "solutions").glob("[0-9][0-9]*_*.ipynb"))
QUESTIONS = sorted((ROOT / "clusterlab/data/questions").glob("*.json"))
# The notebooks' lesson modules hold text the notebooks render with facts.show.
LESSONS = sorted((ROOT / "clusterlab/lessons").glob("*.py"))

# A sentence naming one of these speaks of real systems, not of the emulator.
REAL = re.compile(
    r"\b(NCCL|RCCL|NVLink|NVSwitch|NVLS|NVL\d+|InfiniBand|IB|RoCE|RDMA|ConnectX|GPUDirect|"
    r"SHARP|H100|H200|A100|B200|GB200|HGX|DGX|PCIe|Linux|TCP|RTO|TLP|RACK|PFC|ECN|DCQCN|"
    r"Ethernet|MTU|jumbo|GbE|PyTorch|torch|DDP|FSDP|ZeRO|DeepSpeed|Megatron|torchrun|Gloo|"
    r"nccl-tests|GPUs?|HBM|datacentre|datacenter|data centre|data center|Llama)\b")


def test_the_ledger_loads_and_every_entry_is_sourced():
    ledger = facts.ledger()
    assert ledger, "the ledger is empty"
    for fact in ledger.values():
        assert fact.source.startswith("https://"), fact.id
        assert len(fact.source_title.split()) >= 2, f"{fact.id}: name the source"
        assert len(fact.holds_for.split()) >= 2, f"{fact.id}: say what version it holds for"
        assert len(fact.says.split()) >= 3, f"{fact.id}: say what the value is"


def test_render_cites_each_fact_once_and_lists_its_source():
    fact = next(iter(facts.ledger().values()))
    text = facts.render(f"A [[{fact.id}]] and again [[{fact.id}]]; bare [[{fact.id}|value]].")
    assert text.count("<sup>[1]</sup>") == 2 and "[2]" not in text
    assert fact.source in text and fact.holds_for in text
    with pytest.raises(KeyError, match="no fact"):
        facts.render("[[no.such_fact]]")


def test_render_one_per_source_gives_facts_from_one_page_one_number():
    by_source: dict[str, list] = {}
    for fact in facts.ledger().values():
        by_source.setdefault(fact.source, []).append(fact)
    a, b = next(group for group in by_source.values() if len(group) > 1)[:2]
    other = next(f for f in facts.ledger().values() if f.source != a.source)
    text = facts.render(f"[[{a.id}]], [[{other.id}]], [[{b.id}]]", one_per_source=True)
    assert text.count("<sup>[1]</sup>") == 2 and text.count("<sup>[2]</sup>") == 1
    assert text.count(a.source) == 1 and "\n3. " not in text
    assert a.holds_for in text and b.holds_for in text


def test_render_fold_sources_keeps_the_list_behind_a_fold():
    a, b = list(facts.ledger().values())[:2]
    text = facts.render(f"[[{a.id}]] and [[{b.id}]].", fold_sources=True)
    body, folded = text.split("<details>", 1)
    assert "<sup>[1]</sup>" in body and a.source not in body
    assert folded.startswith("<summary>Sources (2)</summary>") and a.source in folded
    assert folded.rstrip().endswith("</details>")


def test_a_bad_entry_is_refused_with_its_name(tmp_path, monkeypatch):
    (tmp_path / "x.toml").write_text('[a.b]\nvalue = 1\nsays = "x y z"\nholds_for = "v 1"\n'
                                      'source = "http://insecure"\nsource_title = "a b"\n')
    monkeypatch.setattr(facts, "LEDGER_DIR", tmp_path)
    facts.ledger.cache_clear()
    try:
        with pytest.raises(ValueError, match="a.b.*https"):
            facts.ledger()
    finally:
        monkeypatch.undo()
        facts.ledger.cache_clear()


def _texts_of_notebook(path: Path):
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        yield index, cell["cell_type"], "".join(cell["source"])


def _strings(node, lang="en"):
    """Every string of a question file in one language (both when lang is None)."""
    if isinstance(node, dict):
        if lang and set(node) >= {"en", "ru"}:
            yield from _strings(node[lang], lang)
            return
        for value in node.values():
            yield from _strings(value, lang)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value, lang)
    elif isinstance(node, str):
        yield node


@pytest.mark.parametrize("path", NOTEBOOKS + QUESTIONS + LESSONS,
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fact_id_used_is_in_the_ledger(path):
    if path.suffix == ".json":
        texts = list(_strings(json.loads(path.read_text()), lang=None))
    elif path.suffix == ".py":
        texts = [path.read_text()]
    else:
        texts = [text for _, _, text in _texts_of_notebook(path)]
    unknown = {i for text in texts for i in facts.placeholders(text)} - set(facts.ledger())
    assert not unknown, f"{path.name} names facts the ledger lacks: {sorted(unknown)}"


# "1 GB = 10⁹ bytes" defines a unit; it states nothing about a system.
UNIT_DEFINITION = re.compile(r"\s*=\s*(?:10(?:[⁰¹²³⁴⁵⁶⁷⁸⁹]+|\^\d+)|\d+)\s*(?:bytes|B)\b")


def real_system_violations(text: str, allowed: set[tuple[str, float]],
                           reviewed: frozenset[str] = frozenset()) -> list[str]:
    """`reviewed`: figures tests/data/markdown_figures.json defines for this notebook (an
    emulator setting such as a lab's dilation is no real-system constant)."""
    bad = []
    for m, sentence in figures(text):
        if not REAL.search(CODE.sub(" ", sentence)):
            continue
        # In a derivation only the premises (left of the first = or ≈) are stated constants.
        head = re.split(r"[=≈]", sentence, maxsplit=1)[0]
        if m.group(0) not in head:
            continue
        rest = sentence[m.end():]
        if number(m["value"]) == 1 and UNIT_DEFINITION.match(rest):
            continue
        # "6 × {P}": a product with a template placeholder, not a ratio.
        if unit_of(m) == "×" and rest.lstrip().startswith("{"):
            continue
        if quantity(number(m["value"]), unit_of(m)) in allowed:
            continue
        if " ".join(m.group(0).split()) in reviewed:
            continue
        bad.append(f"{' '.join(m.group(0).split())!r} in {' '.join(sentence.split())[:150]!r}")
    return bad


def test_the_rule_flags_untracked_constants_and_spares_ledger_values():
    value = facts.get("pytorch.nccl_timeout_default")
    # The ledger as far as this text goes (the real one may well hold 400 Gb/s by now).
    allowed = {quantity(float(value.value), value.unit), quantity(1.0, "gbit")}
    text = (f"NCCL times out after {value.text}. A ConnectX-7 runs at 400 Gb/s. "
            "Here the emulated NIC is 1 Gbit/s, so 4 MiB takes 32 ms ≈ 4 × 8 ms. "
            "The run took 12 ms.")
    flagged = [b.split(" in ")[0] for b in real_system_violations(text, allowed)]
    assert flagged == ["'400 Gb/s'"]


def question_violations(question: dict, allowed: set[tuple[str, float]]) -> list[str]:
    """The real-system figures a question states in its answers that neither its own text
    (its premises) nor the ledger provides."""
    premises = {quantity(number(m["value"]), unit_of(m))
                for text in _strings(question["text"]) for m, _ in figures(text)}
    rest = {k: v for k, v in question.items() if k != "text"}
    return [f"{question['id']}: {b}" for text in _strings(rest)
            for b in real_system_violations(text, allowed | premises)]


def test_a_question_may_reuse_its_premises_but_not_state_new_constants():
    question = {
        "id": "probe",
        "text": {"en": "On 32 GPUs one GPU is 20% slower; each node has one 100 Gbit/s NIC "
                       "and sends a {S} GB buffer (1 GB = 10⁹ bytes) over TCP.",
                 "ru": "На 32 GPU один GPU на 20% медленнее."},
        "options": [
            {"text": {"en": "Every DDP step becomes up to 20% longer.", "ru": "—"},
             "explanation": {"en": "The 100 Gbit/s NIC is the bottleneck for 6 × {S} GB of "
                                   "GPU traffic (1 MB = 10⁶ bytes).", "ru": "—"}},
            {"text": {"en": "Linux's minimum RTO is 200 ms, so TCP stalls.", "ru": "—"},
             "explanation": {"en": "DDP's 25 MB buckets and a 400 Gbit/s NIC per GPU. DDP's "
                                   "bucket cap is 25 MiB.", "ru": "—"}},
        ],
    }
    ledger = {quantity(25.0, "MiB")}  # stands for the ledger, whatever it holds today
    flagged = [b.split(": ", 1)[1].split(" in ")[0]
               for b in question_violations(question, ledger)]
    assert flagged == ["'200 ms'", "'25 MB'", "'400 Gbit/s'"], flagged


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_real_system_constants_in_notebooks_come_from_the_ledger(nb):
    cells = json.loads(nb.read_text())["cells"]
    allowed = ledger_quantities() | code_inputs(cells, nb)
    name = f"{nb.parent.name}/{nb.name}"
    reviewed = frozenset(ALLOWED["figures"]) | {
        key.split(": ", 1)[1] for key in ALLOWED["scoped"] if key.split(": ", 1)[0] == name}
    bad = []
    for index, kind, text in _texts_of_notebook(nb):
        if kind != "markdown":
            continue
        if re.match(r"\s*##\s+Self-check", text):
            text = " ".join(DETAILS.findall(text))
        text = PROMPT.sub(" ", text)
        bad += [f"cell {index}: {b}" for b in real_system_violations(text, allowed, reviewed)]
    assert not bad, (f"{nb.name}: real-system constants not in the ledger (add them to "
                     "clusterlab/data/facts with a source, or render them with facts.show):\n"
                     + "\n".join(bad))


@pytest.mark.parametrize("path", QUESTIONS, ids=lambda p: p.stem)
def test_real_system_constants_in_questions_come_from_the_ledger(path):
    allowed = ledger_quantities()
    doc = json.loads(path.read_text())
    bad = [b for text in _strings(doc["title"]) for b in real_system_violations(text, allowed)]
    for question in doc["questions"]:
        bad += question_violations(question, allowed)
    assert not bad, (f"{path.name}: real-system constants not in the ledger:\n"
                     + "\n".join(bad))
