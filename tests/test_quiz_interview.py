"""The rehearsal questions on sharding, parallelism, compression, failures and cluster
diagnostics: their formulas (clusterlab.interview_math) against first principles, and every
numeric answer recomputed independently over many draws."""

from __future__ import annotations

import json
import math
import random

import pytest

from clusterlab import interview_math as IM
from clusterlab import models as M
from clusterlab.quiz.bank import QUESTIONS_DIR as QUESTIONS
from clusterlab.quiz.bank import Bank
from clusterlab.quiz.numfmt import fmt

NEW_TOPICS = ("parallelism_traffic", "compression", "failures_at_scale", "cluster_diagnostics")


@pytest.fixture(scope="module")
def bank() -> Bank:
    return Bank.load()


def _zero(P, N, stage):  # bytes per parameter: weights 2, grads 2, optimizer 12
    w, g, o = 2, 2, 12
    return P * {0: w + g + o, 1: w + g + o / N, 2: w + (g + o) / N, 3: (w + g + o) / N}[stage]


def _mfu_t(p):
    return round(6 * p["P"] * 1e9 * p["Tk"] * 1e6 / (p["g"] * p["peak"] * 1e12 * p["u"] / 100), 1)


GBIT = 1e9 / 8
# Each new numeric question: its answer from first principles, in the question's unit.
REFERENCES = {
    "par-7b-allreduce-rails": lambda p: 1e3 * (
        2 * (7 * (2e-6 + p["P"] * 1e9 * p["b"] / 8 / (p["NV"] * 1e9)))
        + 2 * 7 * (p["a"] * 1e-6 + p["P"] * 1e9 * p["b"] / 8 / 8 / (p["B"] * GBIT))),
    "par-7b-step-compute": lambda p: 6 * p["P"] * 1e9 * p["Tk"] * 1e6 / (
        64 * p["peak"] * 1e12 * p["mfu"] / 100),
    "par-zero-memory": lambda p: _zero(p["P"] * 1e9, p["N"], p["stage"]) / 1e9,
    "par-fsdp-traffic": lambda p: 3 * (p["N"] - 1) / p["N"] * p["P"] * 1e9 * 2 / 1e9,
    "par-tp-bytes": lambda p: 4 * p["layers"] * 2 * (p["t"] - 1) / p["t"] * p["b"] * p["s"]
    * p["h"] * 2 / 1e9,
    "par-pipeline-bubble": lambda p: 100 * (p["p"] - 1) / (p["m"] + p["p"] - 1),
    "par-moe-dispatch": lambda p: 2 * p["Tk"] * 1000 * p["k"] * p["h"] * 2 * (p["E"] - 1)
    / p["E"] / 1e6,
    "par-moe-capacity": lambda p: math.ceil(round(p["cf"] * p["Tk"] * 1000 * p["k"] / p["E"], 6)),
    "comp-topk-allgather-bytes": lambda p: (p["p"] - 1) * math.ceil(p["d"] / 100 * p["M"] * 1e6)
    * 12 / 1e6,
    "comp-powersgd-ratio": lambda p: p["m"] * p["n"] / ((p["m"] + p["n"]) * p["r"]),
    "fail-cluster-mtbf": lambda p: p["Mg"] * 1000 / p["n"],
    "fail-young-daly": lambda p: math.sqrt(2 * p["C"] * 60 * p["Mg"] * 1000 * 3600 / p["n"]) / 60,
    "fail-waste": lambda p: 100 * (p["C"] / p["tau"] + (p["R"] + p["tau"] / 2) / (p["M"] * 60)),
    "diag-mfu": lambda p: 100 * 6 * p["P"] * 1e9 * p["Tk"] * 1e6 / (
        _mfu_t(p) * p["g"] * p["peak"] * 1e12),
}


def test_the_new_topics_hold_over_30_bilingual_questions_of_every_kind(bank):
    new = [q for q in bank.questions if q.topic in NEW_TOPICS]
    assert len(new) >= 30
    assert {q.kind for q in new} == {"choice", "numeric", "open"}
    assert sum(q.kind == "numeric" for q in new) >= 12
    assert sum("spot the bug" in q.text("en").lower() for q in new) >= 4
    numeric = {q.id for q in bank.questions if q.topic in NEW_TOPICS and q.kind == "numeric"}
    assert numeric == set(REFERENCES), "every interview_math question needs a reference"


@pytest.mark.parametrize("qid", sorted(REFERENCES))
def test_new_numeric_answers_recomputed_independently_for_200_draws(bank, qid):
    q = bank.by_id[qid]
    rng = random.Random(f"interview-{qid}")
    tol = q.raw["tolerance"]
    for _ in range(200):
        inst = bank.draw(q, rng)
        params = {k: inst.env[k] for k in q.raw["params"]}
        expected = REFERENCES[qid](params)
        assert inst.answer == pytest.approx(expected, rel=1e-9), params
        for answer in (repr(expected), fmt(expected, "ru"), expected * (1 + tol / 2)):
            assert bank.grade(inst, answer).status == "correct", (answer, expected)
        assert bank.grade(inst, expected * (1 + 2 * tol)).status == "wrong"
        for lang in ("en", "ru"):  # every placeholder was filled
            assert "{" not in inst.text(lang) and "{" not in inst.solution(lang), (qid, lang)


def test_the_06_to_08_formulas_against_what_the_notebooks_show():
    # 06: two 4-coordinate updates out of 10000 overlap with probability about 16/10000;
    # a dense update always collides
    assert IM.sparse_overlap_probability(10_000, 4) == pytest.approx(16 / 10_000, rel=0.01)
    assert IM.sparse_overlap_probability(32, 32) == 1.0
    # 07: equal batches weigh 1; Join with one of four ranks joined scales by 3/4
    assert IM.mean_of_means_weight(8, 32, 4) == 1.0
    assert IM.mean_of_means_weight(3, 3 + 10 + 40 + 99, 4) == pytest.approx(152 / 12)
    assert IM.join_gradient_scale(3, 4) == 0.75
    # 08: bit 22 is the top mantissa bit: 1.0 becomes 1.5, averaged over 4 ranks +0.125
    assert IM.bitflip_mean_change(22, 4) == 0.125
    assert IM.bitflip_mean_change(23, 1) == 0.5  # the lowest exponent bit: 1.0 -> 0.5


def test_seed_answers_come_in_four_bullets_for_sixty_seconds(bank):
    from clusterlab.quiz.widget import seed_question_text

    for qid in ("seed-gradient-sync", "seed-nic-latency-jitter"):
        q = bank.by_id[qid]
        for lang, heading in (("en", "In 60 seconds"), ("ru", "За 60 секунд")):
            bullets = bank.draw(q, 0).answer_60s(lang)
            assert len(bullets) == 4, (qid, lang)
            # about 150 spoken words a minute
            assert sum(len(b.split()) for b in bullets) <= 150, (qid, lang)
            text = seed_question_text(qid, lang, bank)
            model = {"en": "Model answer", "ru": "Эталонный ответ"}[lang]
            assert heading in text and text.index(heading) < text.index(model), (qid, lang)
            for b in bullets:  # shown whole, before the model answer
                assert b.split()[-1] in text[:text.index(model)], (qid, lang, b)


def test_only_open_questions_take_a_sixty_second_answer(bank):
    from clusterlab.quiz.validate import schema_errors

    doc = json.loads((QUESTIONS / "races.json").read_text(encoding="utf-8"))
    assert schema_errors(doc) == []
    choice = next(q for q in doc["questions"] if q["kind"] == "choice")
    choice["answer_60s"] = [{"en": "a", "ru": "б"}] * 4
    assert schema_errors(doc), "a choice question has no spoken answer"


def test_formulas_against_the_textbook_numbers():
    # ZeRO paper's example: 7.5B parameters on 64 GPUs -> 120 GB, 31.4 GB, 16.6 GB, 1.9 GB
    for stage, gb in ((0, 120), (1, 31.4), (2, 16.6), (3, 1.875)):
        assert IM.zero_memory_per_gpu(7.5e9, 64, stage) / 1e9 == pytest.approx(gb, rel=0.01)
    ddp = IM.sharded_traffic_per_rank(1e9, 8, 0)
    assert IM.sharded_traffic_per_rank(1e9, 8, 3) == pytest.approx(1.5 * ddp)
    assert ddp == pytest.approx(M.ring_allreduce(8, 2e9, 0, 1))  # the ring's bytes per rank
    assert IM.pipeline_bubble(1, 7) == 0 and IM.pipeline_bubble(4, 1) == pytest.approx(0.75)
    assert IM.expert_capacity(1000, 8, 1, 1.0) == 125 and IM.expert_capacity(10, 3, 1, 1) == 4
    assert IM.cluster_mtbf(50_000, 16384) == pytest.approx(50_000 / 16384)
    assert IM.model_flops_utilization(1e9, 1e6, 1.0, 6, 1e15) == pytest.approx(1.0)
    # rails: with NVLink free, the NIC term is a ring all-reduce of 1/8 of the buffer
    assert IM.rail_allreduce(8, 8, 8e9, 0, 0, 1e-5, 1e-9) == pytest.approx(
        M.ring_allreduce(8, 1e9, 1e-5, 1e-9))


@pytest.mark.parametrize("call", [
    lambda: IM.zero_memory_per_gpu(1e9, 8, 4),
    lambda: IM.zero_memory_per_gpu(-1, 8, 1),
    lambda: IM.pipeline_bubble(0, 4),
    lambda: IM.dense_step_compute(1e9, 1e6, 8, 1e15, 1.5),
    lambda: IM.topk_allgather_bytes(100, 0, 4),
    lambda: IM.cluster_mtbf(0, 8),
    lambda: IM.tp_allreduce_bytes(1, 1, 1, 1, 2.5),
    lambda: IM.sparse_overlap_probability(10, 11),
    lambda: IM.mean_of_means_weight(0, 10, 2),
    lambda: IM.join_gradient_scale(5, 4),
    lambda: IM.bitflip_mean_change(31, 4),
])
def test_bad_arguments_are_named(call):
    with pytest.raises(ValueError, match=r"must be"):
        call()


def test_a_review_link_names_a_split_notebook_by_its_number_and_letter(bank):
    split = next(nb for nb in bank.syllabus if nb[2] != "_")  # e.g. 10b_...
    link = {"notebook": split, "section": bank.syllabus[split]["sections"][0]}
    assert bank.section_title(link).startswith(split.split("_")[0] + " ")
