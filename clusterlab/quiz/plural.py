"""Russian nouns that agree with the number before them: «64 узла», «в 512 раз», «2,5 раза».

A template marks the noun that follows a drawn number: ``{N|узел}``, ``{x:.1f|раз}``. The
noun is written in the form it takes after the number 1 in that sentence, which fixes its
case: «всего {N|узел}» (nominative), «на {N|узле}» (prepositional), «из {p|ранга}»
(genitive), «в {x|раз} меньше» (accusative). When that form is shared by several cases
(«теме» is dative and prepositional), the case follows an @: ``{t|теме@datv}``. The
rendered noun is inflected for the number as displayed, with pymorphy3's
``Parse.make_agree_with_number``: 1 and 21 take the singular, 2-4 and 22-24 the genitive
singular in the nominative or accusative, 5-20 the genitive plural, the other cases the
plural of their own case; a decimal fraction («2,5») takes the genitive singular.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache

CASES = ("nomn", "gent", "datv", "accs", "ablt", "loct")
# Parses that are not the common noun a template means (a first name «Токен», an abbreviation)
_SKIP = frozenset({"Name", "Surn", "Patr", "Geox", "Orgn", "Abbr", "Init"})
_INTEGER = re.compile(r"^[+-]?\d[\d\u00a0\u202f ]*$")


class AgreementError(ValueError):
    """A marked noun that cannot be inflected (unknown word, ambiguous case, bad markup)."""


@lru_cache(maxsize=1)
def _morph():
    import pymorphy3  # a dependency of clusterlab (requirements.txt, pyproject.toml)

    return pymorphy3.MorphAnalyzer()


def _case_class(case: str) -> str:
    # The nominative and the accusative of an inanimate noun agree alike with a number.
    return "nomn" if case == "accs" else case


@cache
def _parse(phrase: str):
    """The pymorphy3 parse of a marked noun written after "1", and its case."""
    word, _, case = phrase.strip().partition("@")
    if not word or " " in word:
        raise AgreementError(f"{{…|{phrase}}}: mark one noun, written as after the number 1")
    if case and case not in CASES:
        raise AgreementError(f"{{…|{phrase}}}: unknown case {case!r}; one of {CASES}")
    parses = [
        p for p in _morph().parse(word)
        if p.tag.POS == "NOUN" and p.tag.number == "sing" and not (_SKIP & p.tag.grammemes)
        and p.word == word.lower() and p.tag.case in CASES and (not case or p.tag.case == case)
    ]
    if not parses:
        raise AgreementError(
            f"{{…|{phrase}}}: not a singular noun{' in ' + case if case else ''}; write the "
            "noun as it reads after the number 1")
    # Homonyms of another lemma («пара» is also the genitive of «пар») do not count: the
    # likeliest lemma is the one meant, and the tests check every rendered pair.
    parses = [p for p in parses if p.normal_form == parses[0].normal_form]
    classes = {_case_class(p.tag.case) for p in parses}
    if len(classes) > 1:
        raise AgreementError(
            f"{{…|{phrase}}}: «{word}» can be {sorted(classes)}; add the case, e.g. "
            f"{{…|{word}@{sorted(classes)[0]}}}")
    return parses[0]


def check(phrase: str) -> str | None:
    """None if `phrase` (what follows the | of a placeholder) can agree, else the problem."""
    try:
        _parse(phrase)
    except AgreementError as exc:
        return str(exc)
    return None


def number_value(text: str) -> int | None:
    """The integer a displayed number reads as ("4194304", "16 384"), None for a fraction."""
    text = text.strip()
    if _INTEGER.match(text):
        return abs(int(re.sub(r"\D", "", text)))
    return None


@lru_cache(maxsize=4096)
def agree(number_text: str, phrase: str) -> str:
    """The noun of `phrase` in the form that agrees with the displayed `number_text`."""
    parse = _parse(phrase)
    value = number_value(number_text)
    form = parse.inflect({"sing", "gent"}) if value is None else parse.make_agree_with_number(
        value)
    if form is None:  # pymorphy3 has no such form: keep the word as written
        return parse.word
    return form.word


__all__ = ["AgreementError", "CASES", "agree", "check", "number_value"]
