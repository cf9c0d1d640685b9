"""Russian numerals in the quiz: a noun after a number agrees with it («64 узла», «в 512 раз»,
«62,5 назначения»), in every numeric template over many draws, in the fixed texts of the bank
and in the interface.

The agreement is checked here against a rule written out independently of the renderer
(quiz.plural, which calls pymorphy3's make_agree_with_number): 1 (not 11) takes the singular
of its case; 2-4 (not 12-14) the genitive singular in the nominative or accusative, else the
plural of the case; 5-20 and 0 the genitive plural in the nominative or accusative, else the
plural of the case; a decimal fraction the genitive singular. A word agrees when some case
makes it the form the rule gives.
"""

from __future__ import annotations

import json
import random
import re
from functools import lru_cache

import pymorphy3
import pytest

from clusterlab.quiz.bank import QUESTIONS_DIR, Bank, check_semantics, load_syllabus
from clusterlab.quiz.i18n import t
from clusterlab.quiz.numfmt import fmt
from clusterlab.quiz.plural import agree, check
from clusterlab.quiz.render import feedback_blocks, question_blocks, to_text
from clusterlab.quiz.session import Result

CASES = ("nomn", "gent", "datv", "accs", "ablt", "loct")
# Unit symbols and number words after a number do not decline with it.
INVARIANT = {"с", "мс", "мкс", "нс", "мин", "ч", "б", "кб", "мб", "гб", "тб", "гбит", "мбит",
             "кбит", "тыс", "млн", "млрд", "трлн"}
# A number (not part of a name such as p99 or fp32, not an index such as "GPU 7") and the
# word after it, unless that word is an abbreviation ("тыс.").
PAIR = re.compile(r"(?<![\w,./^·×−-])(?<!GPU )(\d+(?:,\d+)?)\s+([а-яё]+)(?![а-яё.])",
                  re.IGNORECASE)
# A placeholder without agreement markup, followed by a word (a denominator, 1/{N}, is not a
# count).
BARE = re.compile(r"(?<!/)\{([A-Za-z][A-Za-z0-9_]*)(?::[^{}|]+)?\}\s+([а-яё]+)(?![а-яё.])")
DRAWS = 12


@pytest.fixture(scope="module")
def bank() -> Bank:
    return Bank.load()


@lru_cache(maxsize=1)
def morph() -> pymorphy3.MorphAnalyzer:
    return pymorphy3.MorphAnalyzer()


def rule(number: str, case: str) -> set[str]:
    """The grammemes a noun in `case` takes after the displayed `number` (see the docstring)."""
    if "," in number:
        return {"sing", "gent"}
    n = int(number)
    if n % 10 == 1 and n % 100 != 11:
        return {"sing", case}
    few = 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14
    if case in ("nomn", "accs"):
        return {"sing", "gent"} if few else {"plur", "gent"}
    return {"plur", case}


def declinable_noun(word: str) -> bool:
    """The word is a common noun (not a unit, an abbreviation or a name) in its likeliest
    reading."""
    if word.lower() in INVARIANT:
        return False
    best = morph().parse(word)[0]
    return best.tag.POS == "NOUN" and not ({"Abbr", "Name", "Surn", "Patr", "Fixd"}
                                           & best.tag.grammemes)


def agrees(number: str, word: str) -> bool:
    for p in morph().parse(word):
        if p.tag.POS != "NOUN":
            continue
        for case in CASES:
            form = p.inflect(rule(number, case))
            if form is not None and form.word == word.lower():
                return True
    return False


def disagreements(text: str) -> list[str]:
    return [f"«{m.group(0)}»" for m in PAIR.finditer(text)
            if declinable_noun(m.group(2)) and not agrees(m.group(1), m.group(2))]


# ---- the helper ------------------------------------------------------------------------------


@pytest.mark.parametrize("number, noun, expected", [
    ("64", "узел", "узла"),  # «всего 64 узла», the reviewer's examples first
    ("64", "микробатч", "микробатча"),
    ("512", "раз", "раз"),
    ("2048", "раз", "раз"),
    ("2731", "раз", "раз"),
    ("4194304", "элемент", "элемента"),
    ("62,5", "назначение", "назначения"),
    ("1", "узел", "узел"),
    ("11", "узел", "узлов"),
    ("21", "узел", "узел"),
    ("2,5", "раз", "раза"),
    ("21", "узле", "узле"),  # «на 21 узле»
    ("8", "узле", "узлах"),
    ("3", "ранга", "рангов"),  # «из 3 рангов»
    ("1", "ранга", "ранга"),
    ("4", "эксперту", "экспертам"),
    ("2", "лидером", "лидерами"),
    ("112", "вопрос", "вопросов"),
    ("122", "вопрос", "вопроса"),
    ("2", "стадии@gent", "стадий"),
    ("15", "теме@datv", "темам"),
])
def test_the_helper_inflects_a_noun_for_the_number_shown(number, noun, expected):
    assert agree(number, noun) == expected
    assert agrees(number, expected), "the helper and the independent rule agree"


def test_markup_problems_are_reported():
    assert check("узел") is None and check("теме@datv") is None
    assert "after the number 1" in check("узлов")  # written as after 5, not after 1
    assert "add the case" in check("теме")  # dative or prepositional
    assert "unknown case" in check("узел@dat")
    assert "one noun" in check("новый узел")


def test_the_bank_rejects_bad_agreement_markup():
    doc = json.loads((QUESTIONS_DIR / "topology.json").read_text(encoding="utf-8"))
    q = next(q for q in doc["questions"] if q["id"] == "topo-broadcast-checkpoint")
    q["text"]["ru"] = q["text"]["ru"].replace("{N|узел}", "{N|узлов}")
    q["text"]["en"] = q["text"]["en"] + " {N|node}"
    problems = check_semantics({"topology": doc}, load_syllabus())
    assert any("after the number 1" in p for p in problems), problems
    assert any("is for Russian" in p for p in problems), problems


def test_the_scans_catch_the_errors_they_are_for():
    for bad in ("в 512 раза меньше", "62,5 назначений на эксперта", "на 21 узлах", "всего 2 узел"):
        assert disagreements(bad), bad
    for good in ("в 512 раз меньше", "62,5 назначения", "на 21 узле", "всего 64 узла",
                 "p99 времени", "из 64 узлов", "16 тыс. токенов", "GPU 7 узла 0"):
        assert not disagreements(good), good
    # "всего 64 узлов" reads as a genitive («из 64 узлов»): a bare placeholder is refused instead
    assert BARE.search("всего {N} узлов") and not BARE.search("всего {N|узел}")


# ---- the bank ------------------------------------------------------------------------------


def test_a_drawn_number_before_a_russian_noun_is_marked_for_agreement(bank):
    """In a Russian template a placeholder followed by a noun writes {name|noun}: a noun typed
    after a drawn number agrees with one number only."""
    problems = []
    for q in bank.questions:
        if q.kind != "numeric":
            continue
        for part in ("text", "solution"):
            for m in BARE.finditer(q.raw[part]["ru"]):
                if declinable_noun(m.group(2)):
                    problems.append(f"{q.id} {part}: {m.group(0)!r}")
    assert not problems, "\n".join(problems)


def test_russian_nouns_agree_with_every_drawn_number(bank):
    """Every numeric template, drawn DRAWS times, with the feedback that names the answer."""
    problems, pairs = [], 0
    for q in bank.questions:
        if q.kind != "numeric":
            continue
        rng = random.Random(f"agreement-{q.id}")
        for _ in range(DRAWS):
            inst = bank.draw(q, rng)
            result = Result(inst, bank.grade(inst, fmt(inst.answer, "ru")))
            text = to_text(question_blocks(inst, "ru", bank) + feedback_blocks(result, "ru", bank))
            pairs += len(PAIR.findall(text))
            problems += [f"{q.id}: {d}" for d in disagreements(text)]
    assert pairs > 500, "the scan found the number-noun pairs"
    assert not problems, "\n".join(sorted(set(problems)))


def test_russian_nouns_agree_in_the_fixed_texts(bank):
    """Choice and open questions: their numbers are typed, and so must agree."""
    def strings(x):
        if isinstance(x, dict):
            if "ru" in x and isinstance(x["ru"], str):
                yield x["ru"]
            else:
                for v in x.values():
                    yield from strings(v)
        elif isinstance(x, list):
            for v in x:
                yield from strings(v)

    problems = []
    for q in bank.questions:
        if q.kind == "numeric":
            continue
        for text in strings(q.raw):
            problems += [f"{q.id}: {d}" for d in disagreements(text)]
    assert not problems, "\n".join(problems)


def test_the_interface_agrees_with_its_counts():
    assert t("covered", "ru", k=3, n=4) == "Вы назвали 3 из 4 пунктов."
    assert t("covered", "ru", k=1, n=21) == "Вы назвали 1 из 21 пункта."
    assert t("text_fallback", "ru", n=122, t=21).startswith(
        "Тренажёр собеседования: 122 вопроса по 21 теме.")
    assert t("text_fallback", "en", n=122, t=21).startswith("Interview rehearsal quiz: 122 ")


def test_a_word_unit_agrees_with_the_answer(bank):
    inst = bank.draw("par-moe-capacity", seed=9)
    inst.env["answer"] = 2502.0
    result = Result(inst, bank.grade(inst, "2502"))
    text = to_text(feedback_blocks(result, "ru", bank))
    assert "Ожидалось: 2502 токена" in text and "Ваш ответ: 2502 токена" in text
