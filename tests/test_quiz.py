"""Interview rehearsal: the question bank, grading, sessions, progress, widget and terminal."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clusterlab import interview_math as IM
from clusterlab import models as M
from clusterlab.quiz import cli
from clusterlab.quiz.bank import (
    LANGS,
    PASS_SCORE,
    QUESTIONS_DIR,
    SYLLABUS_PATH,
    TOPICS,
    Bank,
    BankError,
)
from clusterlab.quiz.numfmt import AnswerFormatError, fmt, parse_answer
from clusterlab.quiz.progress import ENV_VAR, INTERVALS, Progress, default_path
from clusterlab.quiz.session import Config, Session
from clusterlab.quiz.validate import load_schema, mini_schema_errors, schema_errors

ROOT = Path(__file__).resolve().parent.parent
CYRILLIC = re.compile(r"[А-Яа-яЁё]")


class FakeClock:
    """A clock the test moves by hand (for time limits and due dates)."""

    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def bank() -> Bank:
    return Bank.load()


def topic_docs() -> dict[str, dict]:
    return {
        p.stem: json.loads(p.read_text(encoding="utf-8"))
        for p in sorted(QUESTIONS_DIR.glob("*.json"))
    }


def correct_response(inst, lang="en"):
    """The right answer to a drawn question, as a learner would give it."""
    if inst.kind == "choice":
        return inst.correct_positions()
    if inst.kind == "numeric":
        return fmt(inst.answer, lang)
    return set(range(len(inst.checklist(lang))))


# ---- the bank as data -----------------------------------------------------------------------


def test_bank_size_topics_and_unique_ids():
    docs = topic_docs()
    assert set(docs) == set(TOPICS)
    ids = [q["id"] for doc in docs.values() for q in doc["questions"]]
    assert len(ids) >= 60
    assert len(ids) == len(set(ids)), "question ids must be unique"
    for topic, doc in docs.items():
        assert doc["topic"] == topic
        assert len(doc["questions"]) >= 4, topic
        assert all(q["topic"] == topic for q in doc["questions"])


@pytest.mark.parametrize("topic", TOPICS)
def test_topic_file_matches_the_schema_with_both_validators(topic):
    doc = json.loads((QUESTIONS_DIR / f"{topic}.json").read_text(encoding="utf-8"))
    assert schema_errors(doc) == []
    assert mini_schema_errors(doc, load_schema()) == []  # the fallback agrees


def test_schema_rejects_broken_questions_with_both_validators():
    doc = topic_docs()["topology"]
    broken = []
    bad = copy.deepcopy(doc)
    del bad["questions"][0]["text"]["ru"]  # a language missing
    broken.append(bad)
    bad = copy.deepcopy(doc)
    bad["questions"][0]["options"][0]["explanation"]["en"] = "  "  # blank text
    broken.append(bad)
    bad = copy.deepcopy(doc)
    bad["questions"][0]["difficulty"] = 4
    broken.append(bad)
    bad = copy.deepcopy(doc)
    bad["questions"][0]["checklist"] = [{"en": "a", "ru": "б"}] * 3  # open field on a choice
    broken.append(bad)
    bad = copy.deepcopy(doc)
    del next(q for q in bad["questions"] if q["kind"] == "numeric")["tolerance"]
    broken.append(bad)
    for b in broken:
        assert schema_errors(b), b
        assert mini_schema_errors(b, load_schema()), b


def test_semantic_checks_catch_what_the_schema_cannot(tmp_path):
    docs = topic_docs()
    q = docs["races"]["questions"][0]
    q["section"] = {"notebook": "06b_lock_free_updates", "section": "No such section"}
    for o in q["options"]:
        o["correct"] = False
    docs["topology"]["questions"][0]["id"] = docs["races"]["questions"][1]["id"]
    numeric = next(x for x in docs["collectives_costs"]["questions"] if x["kind"] == "numeric")
    numeric["args"]["alpha"] = "__import__('os')"
    for topic, doc in docs.items():
        (tmp_path / f"{topic}.json").write_text(json.dumps(doc, ensure_ascii=False), "utf-8")
    with pytest.raises(BankError) as err:
        Bank.load(tmp_path)
    text = str(err.value)
    assert "No such section" in text
    assert "no option is correct" in text
    assert "id already used" in text
    assert "may be called" in text


def _walk_texts(q):
    yield "text", q["text"]
    for o in q.get("options", []):
        yield "option", o["text"]
        yield "explanation", o["explanation"]
    for key in ("solution", "model_answer"):
        if key in q:
            yield key, q[key]
    for item in q.get("checklist", []):
        yield "checklist", item


def test_both_languages_everywhere_and_russian_is_russian(bank):
    for q in bank.questions:
        for part, text in _walk_texts(q.raw):
            for lang in LANGS:
                assert text[lang].strip(), (q.id, part, lang)
            if part in ("text", "explanation", "solution", "model_answer"):
                assert CYRILLIC.search(text["ru"]), (q.id, part)
                assert not CYRILLIC.search(text["en"]), (q.id, part)
    for topic in bank.topics():
        assert bank.title(topic, "en") and CYRILLIC.search(bank.title(topic, "ru"))


def test_every_question_links_to_an_existing_notebook_section(bank):
    syllabus = json.loads(SYLLABUS_PATH.read_text(encoding="utf-8"))
    for q in bank.questions:
        for link in [q.section, *q.see_also]:
            assert link["notebook"] in syllabus, q.id
            assert link["section"] in syllabus[link["notebook"]]["sections"], (q.id, link)


def test_choice_questions_have_a_right_answer_and_explain_every_option(bank):
    choices = [q for q in bank.questions if q.kind == "choice"]
    assert len(choices) >= 20
    assert any(q.multiple for q in choices) and any(not q.multiple for q in choices)
    for q in choices:
        flags = [o["correct"] for o in q.raw["options"]]
        assert any(flags) and not all(flags), q.id
        for o in q.raw["options"]:
            for lang in LANGS:
                assert len(o["explanation"][lang]) > 40, (q.id, "explanations must teach")


def test_open_questions_have_model_answers_and_checklists(bank):
    opens = [q for q in bank.questions if q.kind == "open"]
    assert len(opens) >= 5
    for q in opens:
        assert len(q.raw["checklist"]) >= 3
        for lang in LANGS:
            assert len(q.raw["model_answer"][lang]) > 400, q.id


SPOKEN_WORDS = 250  # a model answer must fit a spoken interview answer; the rest is folded


def test_open_answers_fit_a_spoken_answer_and_fold_the_rest(bank):
    from clusterlab.quiz.render import inline_html, open_reveal_blocks, to_html, to_text

    folded = 0
    for q in (q for q in bank.questions if q.kind == "open"):
        inst = bank.draw(q, 0)
        for lang in LANGS:
            words = len(q.raw["model_answer"][lang].split())
            assert words <= SPOKEN_WORDS, (q.id, lang, words)
            more = inst.answer_more(lang)
            if more is None:
                continue
            folded += 1
            assert len(more) > len(q.raw["model_answer"][lang]), (q.id, lang)
            blocks = open_reveal_blocks(inst, lang)
            label = {"en": "More", "ru": "Подробнее"}[lang]
            page = to_html(blocks)
            assert page.count("<details") == 1 and "<summary" in page and label in page
            shown, rest = page.split("<details", 1)
            folded_part = rest.split("</details>", 1)[0]
            for para in more.split("\n\n"):  # the long version, whole, inside the fold
                assert inline_html(para) in folded_part, (q.id, para[:40])
            for para in q.raw["model_answer"][lang].split("\n\n"):  # the short one, open
                assert inline_html(para) in shown, (q.id, para[:40])
            text = to_text(blocks)
            assert f"{label}:" in text and more.split()[-1] in text
    assert folded >= 2 * 5, "the long versions of the open questions sit behind the fold"


def _ru_en_pairs():
    """Every (where, en, ru) text of the bank."""

    def walk(x, where):
        if isinstance(x, dict):
            if set(x) == {"en", "ru"} and isinstance(x["en"], str):
                yield where, x["en"], x["ru"]
            else:
                for k, v in x.items():
                    yield from walk(v, f"{where}.{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                yield from walk(v, f"{where}[{i}]")

    for topic, doc in topic_docs().items():
        yield from walk(doc["title"], f"{topic}.title")
        for q in doc["questions"]:
            yield from walk(q, q["id"])


# Russian: one term per concept, one register. (banned pattern, why / what to write instead)
RU_BANNED = [
    (r"\bшаг\w*\s+обучения", "«learning rate» (a «шаг обучения» also means a training step)"),
    (r"\bоткрыт(?!\w*\s+вопрос)\w*", "«неперекрытый обмен», not «открытый»"),
    (r"\bколлектив(?!н)\w*", "«коллективная операция», not a bare «коллектив»"),
    (r"\bчлен\w*", "«слагаемое» for a term of a sum"),
    (r"bounded staleness|устарелост", "one spelling: «ограниченное устаревание»"),
    (r"\b(тих|скрыт)\w*\s+(расхожд|расход|дивергенц)\w*", "one name: «silent divergence»"),
    (
        r"\b(желез[оае]\w*|даталоадер\w*|запускалк\w*|тормоз\w*|самописн\w*|лосс\w*|гоня\w*"
        r"|прогон\w*|прогнать|спарит\w*|сид(ом|а|у)?|флап\w*|дроп\w*|алерт\w*|клиппинг\w*"
        r"|паттерн\w*)\b",
        "slang beside textbook prose",
    ),
]
# Where the English says X, the Russian says the one chosen term for it.
RU_SAME_TERM = [
    (r"learning rate", r"learning rate"),
    (r"silent divergence", r"silent divergence"),
    (r"bounded staleness", r"ограниченн\w*\s+устарева\w*"),
    (r"\bexposed\b", r"неперекрыт"),
]


def test_russian_uses_one_term_per_concept():
    problems = []
    for where, en, ru in _ru_en_pairs():
        for pattern, why in RU_BANNED:
            for m in re.finditer(pattern, ru, re.IGNORECASE):
                problems.append(f"{where}: «{m.group(0)}» — {why}")
        for en_term, ru_term in RU_SAME_TERM:
            if re.search(en_term, en, re.IGNORECASE) and not re.search(ru_term, ru, re.IGNORECASE):
                problems.append(
                    f"{where}: the English says {en_term!r}, the Russian lacks {ru_term!r}"
                )
    assert not problems, "\n".join(problems)


def test_the_terminology_check_catches_the_banned_variants():
    samples = [
        "уменьшить шаг обучения",
        "открытый обмен",
        "в каком коллективе стоит ранг",
        "член задержки",
        "bounded staleness",
        "ограниченная устарелость",
        "тихое расхождение реплик",
        "медленный даталоадер",
    ]
    for text in samples:
        assert any(re.search(p, text, re.IGNORECASE) for p, _ in RU_BANNED), text
    for text in ("открытый вопрос", "коллективная операция", "решать коллективно", "слагаемое"):
        assert not any(re.search(p, text, re.IGNORECASE) for p, _ in RU_BANNED), text


def test_conditional_sentences_follow_the_draw(bank):
    """cc-recursive-doubling-time says which algorithm wins, computed from the drawn numbers."""
    q = bank.by_id["cc-recursive-doubling-time"]
    rng = random.Random(3)
    seen = set()
    for _ in range(300):
        inst = bank.draw(q, rng)
        rd_wins = inst.env["ring_us"] > inst.answer
        text = inst.solution("en")
        assert ("Recursive doubling is" in text) == rd_wins, inst.env
        assert ("the ring is" in text) == (not rd_wins), inst.env
        assert ("Recursive doubling здесь быстрее" in inst.solution("ru")) == rd_wins
        seen.add(rd_wins)
    assert seen == {True, False}, "both branches are drawn"


SEED_POINTS = {
    # every point of the seed answer, and what goes beyond it (en, ru)
    "seed-nic-latency-jitter": [
        ("NIC", "NIC"),
        ("latency", "задержк"),
        ("jitter", "джиттер"),
        ("all-reduce", "all-reduce"),
        ("GPUs sit idle", "простаивают"),
        ("protocol support", "поддержка протоколов"),
        ("under load", "под нагрузкой"),
        ("small messages", "маленьких сообщений"),
        ("predict", "предсказуем"),
        ("time-to-train", "time-to-train"),
        ("RDMA", "RDMA"),
        ("RoCE", "RoCE"),
        ("InfiniBand", "InfiniBand"),
        ("GPUDirect", "GPUDirect"),
        ("incast", "incast"),
        ("p99", "p99"),
        ("J(N−1)/(N+1)", "J(N−1)/(N+1)"),
        ("1 − (1 − p)^N", "1 − (1 − p)^N"),
        ("bucket", "бакет"),
        ("hierarchical all-reduce", "иерархический all-reduce"),
        ("compression", "сжатие"),
    ],
    "seed-gradient-sync": [
        ("straggler", "straggler"),
        ("step back", "шага назад"),
        ("races", "гонки"),
        ("without locks", "без блокировок"),
        ("batch sizes", "размеры батчей"),
        ("silent divergence", "silent divergence"),
        ("2·sin(π/(4τ + 2))", "2·sin(π/(4τ + 2))"),
        ("SSP", "SSP"),
        ("backup workers", "backup workers"),
        ("Hogwild", "Hogwild"),
        ("(W/N)", "(W/N)"),
        ("fingerprints", "отпечатки параметров"),
        ("NaN", "NaN"),
        ("TORCH_DISTRIBUTED_DEBUG=DETAIL", "TORCH_DISTRIBUTED_DEBUG=DETAIL"),
        ("monitored_barrier", "monitored_barrier"),
    ],
}


# The points of the seed itself, which the spoken-length answer must make (the rest of
# SEED_POINTS may sit in the longer version behind the "More" fold).
SEED_CORE = {
    "seed-nic-latency-jitter": 10,  # NIC ... time-to-train
    "seed-gradient-sync": 6,  # straggler ... silent divergence
}


@pytest.mark.parametrize("qid", sorted(SEED_POINTS))
def test_seed_questions_are_open_and_cover_the_seed_and_more(bank, qid):
    q = bank.by_id[qid]
    assert q.kind == "open"
    for i, (en, ru) in enumerate(SEED_POINTS[qid]):
        for lang, point in (("en", en), ("ru", ru)):
            short = q.raw["model_answer"][lang].lower()
            full = short + q.raw.get("answer_more", {}).get(lang, "").lower()
            assert point.lower() in full, (qid, lang, point)
            if i < SEED_CORE[qid]:
                assert point.lower() in short, (qid, lang, point, "spoken answer")


# What notebook 09 says of the seed texts it prints (its cell on the two seed questions).
SEED_TEXT_TERMS = {
    "seed-nic-latency-jitter": ("In 60 seconds", "RDMA", "GPUDirect", "incast", "p99", "E[max]",
                                "hierarchical", "compression", "NCCL"),
    "seed-gradient-sync": ("In 60 seconds", "SSP", "backup workers", "Hogwild", "global sample",
                           "fingerprint", "before it", "TORCH_DISTRIBUTED_DEBUG=DETAIL",
                           "monitored_barrier", "NCCL"),
}


def _five_grams(text):
    words = text.split()
    return {tuple(words[i:i + 5]) for i in range(len(words) - 4)}


@pytest.mark.parametrize("qid", sorted(SEED_TEXT_TERMS))
def test_seed_texts_hold_what_notebook_09_says_and_more_only_adds(bank, qid):
    from clusterlab.quiz.widget import seed_question_text

    text = seed_question_text(qid, "en", bank)
    assert [term for term in SEED_TEXT_TERMS[qid] if term not in text] == []
    assert "destroys stability" not in text  # races slow dense training (06), need not wreck it
    q = bank.by_id[qid]
    for lang in LANGS:  # "More" holds what the model answer and the 60 seconds leave out
        more = _five_grams(q.raw["answer_more"][lang])
        said = _five_grams(" ".join([q.raw["model_answer"][lang]]
                                    + [b[lang] for b in q.raw["answer_60s"]]))
        assert len(more & said) <= 0.02 * len(more), (qid, lang, sorted(more & said)[:5])


def test_the_topics_of_notebooks_01_to_08b_review_only_those_notebooks(bank):
    """Notebook 09 starts the trainer on these topics: none may send the learner ahead."""
    from clusterlab.quiz.bank import TOPICS_TO_08B

    assert TOPICS_TO_08B and set(TOPICS_TO_08B) < set(bank.topics())
    ahead = [q.id for q in bank.select(TOPICS_TO_08B) if q.section["notebook"] >= "09"]
    assert ahead == []


# ---- numeric questions: recomputed independently, 200 draws each ---------------------------


def _h(n):
    return math.fsum(1 / i for i in range(1, n + 1))


def _busbw_ms(p):
    """bw-allreduce-busbw's displayed time: the buffer at `eff` % of an `L` Gbit/s NIC, in ms."""
    algbw = p["eff"] / 100 * p["L"] / 8 / (2 * (p["N"] - 1) / p["N"])  # GB/s
    return round(p["S"] / algbw * 1e3, 1)


# Topics whose numeric questions are checked in tests/test_quiz_interview.py instead.
NEWER_TOPICS = ("parallelism_traffic", "compression", "failures_at_scale", "cluster_diagnostics")
# For each numeric question: (closed form from first principles, the same through
# clusterlab.models with the argument mapping written out by hand). Both in the question's unit.
GBIT = 1e9 / 8  # bytes per second in one Gbit/s
REFERENCES = {
    "nic-message-time": (
        lambda p: (p["a"] * 1e-6 + p["S"] * 1e3 / (p["B"] * GBIT)) * 1e6,
        lambda p: M.binomial_broadcast(2, p["S"] * 1e3, p["a"] * 1e-6, 1 / (p["B"] * GBIT)) * 1e6,
    ),
    "topo-ps-time": (
        lambda p: 2 * (p["a"] * 1e-6 + p["P"] * p["G"] * 1e6 / p["k"] / (p["B"] * GBIT)) * 1e3,
        lambda p: (
            M.parameter_server(
                p["P"], p["G"] * 1e6, p["a"] * 1e-6, 1 / (p["B"] * GBIT), servers=p["k"]
            )
            * 1e3
        ),
    ),
    "topo-hierarchical-time": (
        lambda p: (
            (
                2 * math.ceil(math.log2(p["P"])) * (p["ai"] * 1e-6 + p["G"] * 1e6 / (p["Bi"] * 1e9))
                + 2 * (p["N"] - 1) * p["ae"] * 1e-6
                + 2 * (p["N"] - 1) / p["N"] * p["G"] * 1e6 / (p["Be"] * GBIT)
            )
            * 1e3
        ),
        lambda p: (
            M.hierarchical_allreduce(
                p["N"],
                p["P"],
                p["G"] * 1e6,
                p["ai"] * 1e-6,
                1 / (p["Bi"] * 1e9),
                p["ae"] * 1e-6,
                1 / (p["Be"] * GBIT),
            )
            * 1e3
        ),
    ),
    "topo-broadcast-checkpoint": (
        lambda p: math.ceil(math.log2(p["N"])) * (p["a"] * 1e-6 + p["C"] * 1e9 / (p["B"] * GBIT)),
        lambda p: M.binomial_broadcast(p["N"], p["C"] * 1e9, p["a"] * 1e-6, 1 / (p["B"] * GBIT)),
    ),
    "cc-ring-allreduce-time": (
        lambda p: (
            (
                2 * (p["N"] - 1) * p["a"] * 1e-6
                + 2 * (p["N"] - 1) / p["N"] * p["G"] * 1e9 / (p["B"] * GBIT)
            )
            * 1e3
        ),
        lambda p: M.ring_allreduce(p["N"], p["G"] * 1e9, p["a"] * 1e-6, 1 / (p["B"] * GBIT)) * 1e3,
    ),
    "cc-recursive-doubling-time": (
        lambda p: math.log2(p["N"]) * (p["a"] * 1e-6 + p["K"] * 1e3 / (p["B"] * GBIT)) * 1e6,
        lambda p: (
            M.recursive_doubling_allreduce(p["N"], p["K"] * 1e3, p["a"] * 1e-6, 1 / (p["B"] * GBIT))
            * 1e6
        ),
    ),
    "cc-rabenseifner-time": (
        lambda p: (
            (
                2 * math.log2(p["N"]) * p["a"] * 1e-6
                + 2 * (p["N"] - 1) / p["N"] * p["M"] * 1e6 / (p["B"] * GBIT)
            )
            * 1e3
        ),
        lambda p: (
            M.rabenseifner_allreduce(p["N"], p["M"] * 1e6, p["a"] * 1e-6, 1 / (p["B"] * GBIT)) * 1e3
        ),
    ),
    "cc-fsdp-allgather-time": (
        lambda p: (
            ((p["N"] - 1) * p["a"] * 1e-6 + (p["N"] - 1) / p["N"] * p["M"] * 1e6 / (p["B"] * GBIT))
            * 1e3
        ),
        lambda p: M.ring_allgather(p["N"], p["M"] * 1e6, p["a"] * 1e-6, 1 / (p["B"] * GBIT)) * 1e3,
    ),
    "cc-zero2-reduce-scatter-time": (
        lambda p: (
            ((p["N"] - 1) * p["a"] * 1e-6 + (p["N"] - 1) / p["N"] * p["G"] * 1e9 / (p["B"] * GBIT))
            * 1e3
        ),
        lambda p: (
            M.ring_reduce_scatter(p["N"], p["G"] * 1e9, p["a"] * 1e-6, 1 / (p["B"] * GBIT)) * 1e3
        ),
    ),
    "bw-allreduce-busbw": (  # the time shown is drawn as a fraction `eff` of the NIC's rate
        lambda p: p["S"] / (_busbw_ms(p) * 1e-3) * 2 * (p["N"] - 1) / p["N"],
        lambda p: M.bus_bandwidth("all_reduce", p["N"], p["S"] * 1e9, _busbw_ms(p) * 1e-3) / 1e9,
    ),
    "bw-algbw-from-busbw": (
        lambda p: p["X"] / (2 * (p["N"] - 1) / p["N"]),
        lambda p: p["X"] / M.busbw_factor("all_reduce", p["N"]),
    ),
    "bw-allgather-busbw": (
        lambda p: p["S"] / (p["T"] * 1e-3) * (p["N"] - 1) / p["N"],
        lambda p: M.bus_bandwidth("all_gather", p["N"], p["S"] * 1e9, p["T"] * 1e-3) / 1e9,
    ),
    "ddp-bucket-total-time": (
        lambda p: (
            p["K"]
            * (
                2 * (p["N"] - 1) * p["a"] * 1e-6
                + 2 * (p["N"] - 1) / p["N"] * p["C"] * 1e6 / (p["B"] * GBIT)
            )
            * 1e3
        ),
        lambda p: (
            p["K"]
            * M.ring_allreduce(p["N"], p["C"] * 1e6, p["a"] * 1e-6, 1 / (p["B"] * GBIT))
            * 1e3
        ),
    ),
    "tail-expected-max-uniform": (
        lambda p: p["J"] * (p["N"] - 1) / (p["N"] + 1),
        lambda p: M.expected_max(p["N"], "uniform", p["J"]),
    ),
    "tail-at-scale-probability": (
        lambda p: (1 - (1 - p["q"] / 100) ** p["N"]) * 100,
        lambda p: M.tail_at_scale(p["q"] / 100, p["N"]) * 100,
    ),
    "strag-expected-step-time": (
        lambda p: p["c"] + p["m"] * _h(p["N"]),
        lambda p: M.straggler_step(p["c"], p["m"], p["N"]),
    ),
    "strag-backup-workers-time": (
        lambda p: p["m"] * (_h(p["N"] + p["b"]) - _h(p["b"])),
        lambda p: p["m"] * (M.harmonic(p["N"] + p["b"]) - M.harmonic(p["b"])),
    ),
    "strag-delayed-gd-stable-lr": (
        lambda p: 2 * math.sin(math.pi / (4 * p["tau"] + 2)) / p["L"],
        lambda p: M.delayed_gd_stable_step(p["tau"]) / p["L"],
    ),
    # Races, gradient scaling, silent divergence (notebooks 06-08), via clusterlab.interview_math.
    "races-sparse-collisions": (  # P(no overlap) = prod_i (d - k - i) / (d - i)
        lambda p: 100 * (1 - math.prod((p["d"] - p["k"] - i) / (p["d"] - i)
                                       for i in range(p["k"]))),
        lambda p: 100 * IM.sparse_overlap_probability(p["d"], p["k"]),
    ),
    "gs-mean-of-means-weight": (  # weight 1/(W n_s) against 1/N
        lambda p: (p["ns"] + (p["W"] - 1) * p["nb"]) / (p["W"] * p["ns"]),
        lambda p: IM.mean_of_means_weight(p["ns"], p["ns"] + (p["W"] - 1) * p["nb"], p["W"]),
    ),
    "gs-join-scale": (  # (W - J) active gradients and J zeros, divided by W
        lambda p: 100 * (p["W"] - p["J"]) / p["W"],
        lambda p: 100 * IM.join_gradient_scale(p["W"] - p["J"], p["W"]),
    ),
    "sd-bitflip-before-allreduce": (  # 1.0 has a zero mantissa: the flip adds 2^(b - 23)
        lambda p: 2.0 ** (p["b"] - 23) / p["W"],
        lambda p: IM.bitflip_mean_change(p["b"], p["W"]),
    ),
}


def test_enough_numeric_questions_over_several_models(bank):
    numeric = [q for q in bank.questions if q.kind == "numeric"]
    assert len(numeric) >= 12
    assert len({q.raw["model"] for q in numeric}) >= 8
    older = {q.id for q in numeric if not q.topic.startswith(NEWER_TOPICS)}
    assert older == set(REFERENCES), "every numeric question needs a reference"


@pytest.mark.parametrize("qid", sorted(REFERENCES))
def test_numeric_answers_recomputed_independently_for_200_draws(bank, qid):
    q = bank.by_id[qid]
    closed_form, via_models = REFERENCES[qid]
    tol = q.raw["tolerance"]
    unit = q.raw["unit"]
    rng = random.Random(f"quiz-{qid}")
    for _ in range(200):
        inst = bank.draw(q, rng)
        params = {k: inst.env[k] for k in q.raw["params"]}
        for name, spec in q.raw["params"].items():  # drawn from the stated ranges
            v = params[name]
            if "choices" in spec:
                assert v in spec["choices"]
            else:
                assert spec["min"] <= v <= spec["max"]
                k = (v - spec["min"]) / spec["step"]
                assert abs(k - round(k)) < 1e-6
        expected = closed_form(params)
        assert via_models(params) == pytest.approx(expected, rel=1e-9)
        assert inst.answer == pytest.approx(expected, rel=1e-9), params
        # graded right: plain numbers, a decimal comma, a unit, a little off within tolerance
        for answer in (repr(expected), fmt(expected, "ru"), expected * (1 + tol / 2)):
            assert bank.grade(inst, answer).status == "correct", (answer, expected)
        if unit["en"]:
            assert bank.grade(inst, f"{expected!r} {unit['en']}").correct
            assert bank.grade(inst, f"{fmt(expected, 'ru')} {unit['ru']}").correct
        # clearly wrong answers are graded wrong
        for wrong in (expected * 1.5, expected / 2, expected * 1000):
            assert bank.grade(inst, repr(wrong)).status == "wrong", (wrong, expected)
        for lang in LANGS:  # the worked solution is filled in completely
            text = inst.solution(lang) + inst.text(lang)
            assert not re.search(r"\{[A-Za-z_][A-Za-z0-9_]*(:[^{}]*)?\}", text), text


def test_numeric_draws_are_reproducible_with_a_seed(bank):
    q = bank.by_id["cc-ring-allreduce-time"]
    a, b = bank.draw(q, 42), bank.draw(q, 42)
    assert a.env == b.env
    seen = {bank.draw(q, s).answer for s in range(30)}
    assert len(seen) > 5  # parameters really vary from draw to draw


# ---- answer parsing and grading ---------------------------------------------------------------


def test_parse_answer_refuses_a_comma_that_could_be_thousands():
    # 09 r20: "1,000" was read as 1.0; an English thousand must not be graded as that
    for text in ("1,000", "12,500", "-2,000 ms"):
        with pytest.raises(AnswerFormatError) as err:
            parse_answer(text, "ms", lang="en")
        assert err.value.reason == "ambiguous"
        assert err.value.message_key == "ambiguous_comma"
    en = {"lang": "en"}
    assert parse_answer("0,125", **en) == 0.125 and parse_answer("1,25", **en) == 1.25
    assert parse_answer("1000", **en) == 1000 and parse_answer("1,0005", **en) == 1.0005
    # in Russian it is the decimal comma the course prints (fmt(1.593, "ru") == "1,593")
    assert parse_answer("1,593", lang="ru") == 1.593 and fmt(1.593, "ru") == "1,593"


def test_parse_answer_accepts_commas_units_and_rejects_garbage():
    assert parse_answer("12,5") == 12.5
    assert parse_answer(" 12.5 ") == 12.5
    assert parse_answer("1 000") == 1000
    assert parse_answer("−3") == -3
    assert parse_answer("1e-3") == 0.001
    assert parse_answer("0.8 ms", "µs") == pytest.approx(800)
    assert parse_answer("2 s", "ms", ("мс",)) == pytest.approx(2000)
    assert parse_answer("12 мс", "ms", ("мс",)) == 12
    assert parse_answer("100 Gbit/s", "GB/s") == pytest.approx(12.5)
    assert parse_answer("40 %", "%") == 40
    for text, unit, reason in (
        ("", "ms", "empty"),
        ("abc", "ms", "not_a_number"),
        ("5 GB/s", "ms", "unit"),
        ("5 parsecs", "ms", "unit"),
    ):
        with pytest.raises(AnswerFormatError) as err:
            parse_answer(text, unit)
        assert err.value.reason == reason


def test_fmt_uses_a_decimal_comma_in_russian():
    assert fmt(2.5, "en") == "2.5" and fmt(2.5, "ru") == "2,5"
    assert fmt(70.07, "ru") == "70,07"
    assert fmt(3.0) == "3" and fmt(12345.6) == "12346" and fmt(0.000123) == "0.000123"


def test_choice_and_open_grading(bank):
    inst = bank.draw("topo-ps-bottleneck", 1)
    right = inst.correct_positions()
    assert len(right) == 3
    assert bank.grade(inst, right).status == "correct"
    assert bank.grade(inst, set(list(right)[:2])).status == "wrong"  # a subset is not enough
    assert bank.grade(inst, set(range(4))).status == "wrong"
    assert bank.grade(inst, set()).status == "skipped"
    assert bank.grade(inst, None).status == "skipped"
    with pytest.raises(ValueError):
        bank.grade(inst, {7})
    opened = bank.draw("seed-gradient-sync", 1)
    n = len(opened.checklist("en"))
    assert bank.grade(opened, range(n)).status == "correct"
    half = bank.grade(opened, range(n // 2))
    assert half.status == "partial" and half.score == pytest.approx((n // 2) / n)
    assert not half.correct and half.score < PASS_SCORE
    assert bank.grade(opened, []).status == "wrong"


def test_options_are_shuffled_but_grading_follows_them(bank):
    orders = {tuple(bank.draw("nic-jitter-definition", s).order) for s in range(20)}
    assert len(orders) > 1
    for s in range(20):
        inst = bank.draw("nic-jitter-definition", s)
        (pos,) = inst.correct_positions()
        assert inst.options("en")[pos].startswith("The variation of message latency")


# ---- sessions ---------------------------------------------------------------------------------


def test_practice_session_gives_immediate_feedback_and_scores(bank):
    s = Session(bank, Config(count=5, seed=7))
    assert s.total == 5 and s.immediate_feedback and s.config.limit is None
    for i in range(5):
        inst = s.begin()
        result = s.answer(correct_response(inst)) if i % 2 == 0 else s.skip()
        assert result.grade.status == ("correct" if i % 2 == 0 else "skipped")
    assert s.finished and s.begin() is None
    summary = s.summary()
    assert (summary.score, summary.planned, summary.unanswered) == (3, 5, 2)
    with pytest.raises(RuntimeError):
        s.skip()


def test_sessions_are_reproducible_with_a_seed(bank):
    a = Session(bank, Config(count=8, seed=11))
    b = Session(bank, Config(count=8, seed=11))
    assert [i.id for i in a.items] == [i.id for i in b.items]
    assert [i.env for i in a.items] == [i.env for i in b.items]


def test_filters_by_topic_difficulty_and_kind(bank):
    s = Session(bank, Config(topics=("races", "topology"), difficulty=frozenset({2})))
    assert s.total > 0
    assert all(i.question.topic in ("races", "topology") for i in s.items)
    assert all(i.question.difficulty == 2 for i in s.items)
    assert all(i.kind == "numeric" for i in Session(bank, Config(kinds=("numeric",))).items)
    with pytest.raises(ValueError):
        Session(bank, Config(topics=("no_such_topic",)))
    with pytest.raises(ValueError):
        Config(mode="exam")
    with pytest.raises(ValueError):
        Config(lang="de")


def test_mock_interview_spreads_topics_and_times_out(bank):
    clock = FakeClock()
    s = Session(bank, Config(mode="mock", count=6, seed=3, time_limit=60), clock=clock)
    assert not s.immediate_feedback and s.total == 6
    assert len({i.question.topic for i in s.items}) == 6  # one question per topic first
    inst = s.begin()
    assert s.remaining() == 60
    clock.t += 59
    assert not s.expired()
    assert s.answer(correct_response(inst)).grade.status == "correct"
    inst = s.begin()
    clock.t += 61  # too late: even a right answer counts as unanswered
    late = s.answer(correct_response(inst))
    assert late.grade.status == "timeout" and late.unanswered and late.grade.score == 0
    s.begin()
    clock.t += 61
    assert s.timeout().grade.status == "timeout"  # what the widget's timer calls
    inst = s.begin()
    s.answer(correct_response(inst))
    s.stop()  # two questions never reached: unanswered in a mock interview
    summary = s.summary()
    assert summary.planned == 6 and summary.asked == 4
    assert summary.score == 2 and summary.unanswered == 4 and summary.percent == 33
    missed = {i.question.topic for i in s.items[1:3]} | {i.question.topic for i in s.items[4:]}
    assert set(summary.weak_topics) == missed
    assert summary.review and all("section" in link for link in summary.review)


def test_open_question_timed_until_the_model_answer_is_shown(bank):
    clock = FakeClock()
    s = Session(
        bank, Config(mode="mock", kinds=("open",), count=2, seed=1, time_limit=30), clock=clock
    )
    s.begin()
    clock.t += 20
    assert s.reveal()  # answered in time; self-grading afterwards is not timed
    clock.t += 100
    assert s.answer({0, 1, 2}).grade.status in ("partial", "correct", "wrong")
    s.begin()
    clock.t += 31
    assert not s.reveal()
    assert s.answer({0, 1, 2}).grade.status == "timeout"


def test_unreadable_number_is_not_recorded(bank):
    s = Session(bank, Config(kinds=("numeric",), count=2, seed=2))
    inst = s.begin()
    with pytest.raises(AnswerFormatError):
        s.answer("twelve")
    assert s.index == 0 and s.current is inst
    assert s.answer(fmt(inst.answer)).grade.correct


def test_weak_topics_are_sorted_weakest_first(bank):
    s = Session(bank, Config(topics=("races", "topology", "algbw_busbw"), count=12, seed=5))
    for inst in s.items:
        s.begin()
        good = inst.question.topic == "algbw_busbw" or (
            inst.question.topic == "topology" and s.index % 2 == 0
        )
        s.answer(correct_response(inst)) if good else s.skip()
    summary = s.summary()
    assert summary.weak_topics[0] == "races"
    assert "algbw_busbw" not in summary.weak_topics


# ---- progress and spaced repetition -------------------------------------------------------------


def test_missing_progress_file_starts_fresh_and_is_created_on_save(tmp_path):
    path = tmp_path / "deep" / "dir" / "progress.json"
    p = Progress(path)
    assert p.data["questions"] == {} and p.recovered is None
    p.record("q1", 1.0)
    assert json.loads(path.read_text(encoding="utf-8"))["questions"]["q1"]["box"] == 2
    assert not list(path.parent.glob("*.tmp"))


def test_progress_path_from_argument_env_or_default(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env.json"))
    assert default_path() == tmp_path / "env.json"
    assert default_path(tmp_path / "arg.json") == tmp_path / "arg.json"
    monkeypatch.delenv(ENV_VAR)
    assert default_path() == Path("~/.clusterlab/quiz_progress.json").expanduser()


def test_spaced_repetition_brings_missed_questions_back_first(tmp_path):
    clock = FakeClock()
    p = Progress(tmp_path / "p.json", clock=clock)
    p.record("known", 1.0)
    p.record("missed", 0.0)
    p.record("half", 0.5)  # an open question with half its key points: a miss
    assert (p.box("known"), p.box("missed"), p.box("half"), p.box("new")) == (2, 1, 1, None)
    order = p.order(["known", "new", "missed", "half"], random.Random(0))
    assert order[:2] in (["missed", "half"], ["half", "missed"])
    assert order[2:] == ["new", "known"]
    clock.t += INTERVALS[2] + 1  # the known one is due again after its interval
    p.record("missed", 1.0)
    assert p.order(["known", "missed"])[0] == "known"
    for _ in range(10):
        p.record("known", 1.0)
    assert p.box("known") == 5  # boxes top out
    p.record("known", 0.0)
    assert p.box("known") == 1  # one miss sends it back to the start
    history = p.data["questions"]["known"]["history"]
    assert len(history) <= 20 and history[-1]["score"] == 0.0


def test_session_order_follows_progress(bank, tmp_path):
    progress = Progress(tmp_path / "p.json")
    first = Session(bank, Config(topics=("races",), seed=1), progress)
    missed_id = first.items[-1].id
    for inst in first.items:
        first.begin()
        first.skip() if inst.id == missed_id else first.answer(correct_response(inst))
    assert progress.data["sessions"][-1]["asked"] == len(first.items)
    again = Session(bank, Config(topics=("races",), seed=99), Progress(tmp_path / "p.json"))
    assert again.items[0].id == missed_id


@pytest.mark.parametrize("content", ["{not json", "[1, 2, 3]", '{"version": 1}', "\x00\xff"])
def test_corrupt_progress_file_is_kept_as_backup_and_replaced(tmp_path, content):
    path = tmp_path / "quiz_progress.json"
    path.write_bytes(
        content.encode("utf-8", "surrogateescape") if content != "\x00\xff" else b"\x00\xff\xfe"
    )
    original = path.read_bytes()
    with pytest.warns(RuntimeWarning, match="kept it as"):
        p = Progress(path)
    backups = list(tmp_path.glob("quiz_progress.json.bak-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == original
    assert p.recovered == backups[0] and p.data["questions"] == {}
    p.record("q", 1.0)  # no crash, a valid file again
    assert json.loads(path.read_text(encoding="utf-8"))["questions"]["q"]["seen"] == 1
    with pytest.warns(RuntimeWarning):  # a second corruption keeps both backups
        path.write_text("garbage", encoding="utf-8")
        Progress(path)
    assert len(list(tmp_path.glob("quiz_progress.json.bak-*"))) == 2


def test_progress_writes_are_atomic(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    p = Progress(path)
    p.record("q1", 1.0)
    before = path.read_bytes()

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("clusterlab.quiz.progress.os.replace", failing_replace)
    with pytest.raises(OSError):
        p.record("q2", 1.0)
    assert path.read_bytes() == before  # the old file is intact
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # no debris


def test_two_writers_merge_instead_of_overwriting(tmp_path):
    path = tmp_path / "p.json"
    a, b = Progress(path), Progress(path)
    a.record("from-a", 1.0)
    b.record("from-b", 0.0)
    merged = json.loads(path.read_text(encoding="utf-8"))["questions"]
    assert set(merged) == {"from-a", "from-b"}


# ---- the widget, headless ---------------------------------------------------------------------


@pytest.fixture
def widget_factory(bank):
    made = []

    def make(**kwargs):
        kwargs.setdefault("progress", False)
        kwargs.setdefault("timer", False)
        from clusterlab.quiz.widget import QuizWidget

        w = QuizWidget(bank, **kwargs)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def test_widget_practice_choice_feedback_in_both_languages(widget_factory):
    w = widget_factory(kinds=("choice",), seed=4, count=3)
    assert "questions" in w.text_summary()
    w.on_start()
    w.on_submit()  # nothing chosen yet
    assert "Choose at least one option" in w.message
    inst = w.session.current
    w.select_options(inst.correct_positions())
    w.on_submit()
    assert w.last_result.grade.status == "correct"
    assert w.message.startswith("Correct.") and "Review:" in w.message
    w.on_next()
    inst = w.session.current
    wrong = {p for p in range(len(inst.order)) if p not in inst.correct_positions()}
    w.select_options({min(wrong)})
    w.on_submit()
    assert w.message.startswith("Not quite.")
    flat = " ".join(w.message.split())
    assert " ".join(inst.explanation(min(wrong), "en").split()) in flat  # why it is wrong
    w.lang.value = "ru"  # switching language re-renders the feedback
    assert w.message.startswith("Неверно.") and "Повторить" in w.message


def test_widget_numeric_rejects_garbage_then_accepts_a_comma(widget_factory):
    w = widget_factory(kinds=("numeric",), seed=6, count=2, lang="ru")
    inst = w.session.current if w.session else None
    assert inst is None
    w.on_start()
    inst = w.session.current
    w.set_numeric("много")
    w.on_submit()
    assert "Не получилось прочитать число" in w.message and w.session.index == 0
    w.set_numeric(fmt(inst.answer, "ru"))
    w.on_submit()
    assert w.last_result.grade.status == "correct"
    assert w.message.startswith("Верно.") and "Решение" in w.message


def test_widget_open_question_reveal_and_self_grade(widget_factory):
    w = widget_factory(kinds=("open",), seed=2, count=1)
    w.on_start()
    n = len(w.session.current.checklist("en"))
    w.on_submit()  # first press reveals the model answer
    assert "Model answer" in w.question.value and len(w._tick_boxes) == n
    if w.session.current.answer_more("en"):  # the long version, folded
        assert "<details" in w.question.value and ">More</summary>" in w.question.value
    w.tick_points(range(n))
    w.on_submit()
    assert w.last_result.grade.status == "correct"
    assert f"You covered {n} of {n} key points." in w.message
    assert "Model answer" not in w.message  # already on screen, not repeated
    w.on_next()  # past the last question: the summary
    assert "Score: 1 of 1 (100%)" in w.message


def test_widget_mock_timer_expiry_counts_as_unanswered(widget_factory):
    clock = FakeClock()
    w = widget_factory(mode="mock", count=3, time_limit=30, seed=8, clock=clock)
    w.on_start()
    assert "0:30" in w.timer_label.value
    clock.t += 12
    w.tick()
    assert "0:18" in w.timer_label.value
    clock.t += 19
    w.tick()  # time is up
    assert w.session.results[0].grade.status == "timeout"
    assert w.session.index == 1 and "Time ran out" in w.message
    for _ in range(2):
        inst = w.session.current
        if inst.kind == "choice":
            w.select_options(inst.correct_positions())
        elif inst.kind == "numeric":
            w.set_numeric(fmt(inst.answer))
        else:
            w.on_reveal()
            w.tick_points(range(len(inst.checklist("en"))))
        w.on_submit()
    assert w.session.finished
    assert "Score: 2 of 3 (67%) · Unanswered: 1" in w.message
    assert "Review of your answers" in w.message  # a mock interview explains at the end


def test_widget_background_timer_runs_and_stops_cleanly(widget_factory):
    w = widget_factory(mode="mock", count=2, time_limit=1, seed=1, timer=True)
    w.tick_interval = 0.02
    w.on_start()
    assert w.timer_running
    deadline = time.monotonic() + 10
    while not w.session.results and time.monotonic() < deadline:
        time.sleep(0.02)
    assert w.session.results[0].grade.status == "timeout"
    w.close()
    assert not w.timer_running
    assert not [t for t in threading.enumerate() if t.name == "quiz-timer" and t.is_alive()]


def test_widget_degrades_to_text(widget_factory, monkeypatch, bank):
    w = widget_factory()
    bundle = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert f"{len(bank.questions)} questions" in bundle["text/plain"]
    from clusterlab.quiz import widget as widget_module

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # as if it were not installed
    fallback = widget_module.launch(bank)
    assert isinstance(fallback, widget_module.TextQuiz)
    assert "python -m clusterlab.quiz" in repr(fallback)


def test_static_sample_and_seed_text_are_deterministic(bank):
    from clusterlab.quiz.widget import seed_question_text, static_sample

    assert static_sample(bank, seed=9) == static_sample(bank, seed=9)
    assert "Correct." in static_sample(bank, seed=9)
    from clusterlab.quiz.bank import TOPICS_TO_08B

    three = static_sample(bank, seed=9, kinds=("numeric", "choice", "open"), topics=TOPICS_TO_08B)
    assert three.count("Correct.") == 2 and "Model answer" in three and "Key points" in three
    assert "Self-graded: " in three, "an open answer ticked by the learner is not labelled Correct"
    assert "More:" not in three, "an open answer's longer version stays folded"
    assert not any(bank.title(t, "en") in three for t in bank.topics() if t not in TOPICS_TO_08B)
    text = seed_question_text("seed-nic-latency-jitter", "ru", bank)
    assert "Эталонный ответ" in text and "Ключевые пункты" in text


# ---- the terminal mode ---------------------------------------------------------------------------


def _scripted_answers(bank, config, lang):
    """Lines that answer every question of the session the CLI will build, correctly."""
    session = Session(bank, config, Progress(save=False))
    lines = []
    for inst in session.items:
        if inst.kind == "choice":
            lines.append(",".join("ABCDEFG"[p] for p in sorted(inst.correct_positions())))
        elif inst.kind == "numeric":
            lines.append(fmt(inst.answer, lang))
        else:
            lines += ["", "all"]
    return lines


def test_terminal_mode_through_a_pipe_in_both_languages(bank, tmp_path):
    runs = {
        "en": ("practice", ["Question 1 of 5", "Correct.", "Score: 5 of 5 (100%)"]),
        "ru": (
            "mock",
            ["Вопрос 1 из 5", "Ответ записан.", "Результат: 5 из 5 (100%)", "Разбор ответов"],
        ),
    }
    env = dict(os.environ, PYTHONIOENCODING="utf-8", HOME=str(tmp_path))
    env.pop(ENV_VAR, None)
    procs = {}
    for lang, (mode, _) in runs.items():  # both at once: each pays for importing torch
        config = Config(lang=lang, mode=mode, count=5, seed=21)
        stdin = "\n".join(_scripted_answers(bank, config, lang)) + "\n"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "clusterlab.quiz",
                "--lang",
                lang,
                "--mode",
                mode,
                "--count",
                "5",
                "--seed",
                "21",
                "--no-progress",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            env=env,
            cwd=ROOT,
        )
        procs[lang] = (proc, stdin)
    for lang, (proc, stdin) in procs.items():
        out, err = proc.communicate(stdin, timeout=120)
        assert proc.returncode == 0, err
        for text in runs[lang][1]:
            assert text in out, (text, out[-2000:])
    assert not (tmp_path / ".clusterlab").exists()  # --no-progress touched nothing


def run_cli(argv, lines):
    out = io.StringIO()
    code = cli.main(argv, stdin=io.StringIO("".join(f"{x}\n" for x in lines)), stdout=out)
    return code, out.getvalue()


def test_terminal_reprompts_on_bad_input_and_saves_progress(bank, tmp_path):
    path = tmp_path / "progress.json"
    config = Config(kinds=("choice",), count=2, seed=5)
    right = _scripted_answers(bank, config, "en")
    code, out = run_cli(
        ["--kinds", "choice", "--count", "2", "--seed", "5", "--progress", str(path)],
        ["Z", "99", right[0], ""],
    )
    assert code == 0
    assert out.count("Answer with option letters") == 2
    assert "Score: 1 of 2 (50%) · Unanswered: 1" in out
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert len(saved["questions"]) == 2 and saved["sessions"][-1]["score"] == 1


def test_terminal_numeric_accepts_units_and_quits_early(bank):
    config = Config(kinds=("numeric",), count=3, seed=8, lang="ru")
    session = Session(bank, config, Progress(save=False))
    first = session.items[0]
    unit = first.unit("en")
    answer = f"{fmt(first.answer, 'en')} {unit}" if unit else fmt(first.answer, "en")
    code, out = run_cli(
        ["--kinds", "numeric", "--count", "3", "--seed", "8", "--lang", "ru", "--no-progress"],
        ["abc", answer, "q"],
    )
    assert code == 0
    assert "Не получилось прочитать число" in out and "Верно." in out
    assert "Результат: 1 из 1 (100%)" in out  # practice: only what was asked counts


def test_terminal_end_of_input_and_listing(bank):
    code, out = run_cli(["--mode", "mock", "--count", "2", "--seed", "1", "--no-progress"], [])
    assert code == 0 and "Score: 0 of 2 (0%) · Unanswered: 2" in out
    code, out = run_cli(["--list-topics", "--lang", "ru"], [])
    assert code == 0 and all(topic in out for topic in TOPICS) and "Отладка зависаний" in out
    with pytest.raises(SystemExit):
        run_cli(["--topics", "nonsense"], [])
    with pytest.raises(SystemExit):
        run_cli(["--difficulty", "5"], [])
    assert cli.parse_difficulty("2-3") == {2, 3} and cli.parse_difficulty("all") is None
    assert cli.parse_letters("а, С", 4) == {0, 2}  # Cyrillic look-alikes from a Russian layout
    assert cli.parse_letters("bd", 4) == {1, 3} and cli.parse_letters("E", 4) is None
    assert cli.parse_ticks("1 3", 4) == {0, 2} and cli.parse_ticks("all", 3) == {0, 1, 2}
    assert cli.parse_ticks("9", 3) is None


def test_russian_interface_agrees_in_case_and_gender(bank):
    from clusterlab.quiz.render import question_blocks, to_text

    inst = bank.draw("par-moe-capacity", seed=9)
    ru = to_text(question_blocks(inst, "ru", bank))
    assert "Введите число в токенах" in ru and "единица —" not in ru
    assert "уровень: базовый" in ru and "сложность:" not in ru
    assert "{Tk},000 tokens" in bank.by_id["par-moe-capacity"].raw["text"]["en"]  # not "16k"
    from clusterlab.quiz.render import link_text

    link = bank.by_id["par-moe-capacity"].section
    assert link_text(bank, link, "ru").startswith("ноутбук 10b «")
    assert link_text(bank, link, "en") == bank.section_title(link)
