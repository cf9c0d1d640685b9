"""Notebook 09's static-view helpers (reviews r10, r20): a partly right open answer with its
marked key points and the pass mark, the fixed mock transcript, and the seed questions' answers
part by part."""

from __future__ import annotations

import pytest

from clusterlab.lessons import interview_rehearsal as rehearsal
from clusterlab.quiz import TOPICS_TO_08B, Bank


@pytest.fixture(scope="module")
def bank():
    return Bank.load()


def test_graded_open_answer_shows_the_marked_key_points_and_the_pass_mark(bank, capsys,
                                                                          monkeypatch):
    # r20: a partly right answer, its key points visible with + marks, the pass mark said,
    # the model answer folded
    shown = []
    monkeypatch.setattr(rehearsal, "display", lambda md: shown.append(md.data))
    rehearsal.show_graded_open_answer("gs-inconsistent-scaling", "partly right", {2, 3, 4},
                                      bank=bank, lang="en")
    printed = capsys.readouterr().out
    assert bank.draw("gs-inconsistent-scaling", 0).text("en").splitlines()[0][:40] in printed
    assert 'The answer: "partly right"' in printed and "Self-graded: 3/8." in printed
    assert "  + 2. Unequal local batches" in printed and "  - 1. DDP averages" in printed
    assert "38% of the key points: below the pass mark of 75%, so the question comes back " \
        "first." in printed
    assert printed.rstrip().splitlines()[-1].startswith("  Review: 07 Gradient scaling")
    assert len(shown) == 1 and shown[0].startswith("<details><summary>Model answer")
    assert "Key points" not in shown[0]


@pytest.mark.parametrize("lang", ["en", "ru"])
def test_seed_answers_are_shown_part_by_part_with_tagged_bullets(bank, lang):
    for qid in rehearsal.SEED_STRUCTURE:
        blocks = rehearsal.structured_answer(qid, bank=bank, lang=lang)
        labels = [text for kind, text in blocks if kind == "h"]
        assert labels[0] == rehearsal.LABELS["mechanism"][lang]
        assert len(blocks) - len(labels) == len(
            bank.draw(qid, 0).model_answer(lang).split("\n\n"))  # every paragraph, once
        head, _, _ = rehearsal.seed_parts(qid, bank=bank, lang=lang)
        tag = rehearsal.LABELS["kp"][lang]
        assert head.count(f"[{tag} ") == 4
    head, _, _ = rehearsal.seed_parts("seed-gradient-sync", bank=bank, lang="en")
    assert " ".join(head.split()).endswith("so catch it early. [KP 9–10]")


@pytest.mark.parametrize("lang", ["en", "ru"])
def test_mock_transcript_counts_the_late_answer_as_a_timeout(bank, capsys, lang):
    rehearsal.show_mock_transcript(bank, lang=lang, topics=TOPICS_TO_08B, seed=4,
                                   answer_after=(45, 150), time_limit=120)
    out = capsys.readouterr().out
    # seed 4 draws sd-nan-from-one-rank first: two right options, both chosen and starred
    assert "answered B and D (the right options) after 45 s: correct" in out
    assert "  * B. " in out and "  * D. " in out and "    A. " in out
    # r21: one word for a late answer, as in the summary's count of unanswered questions
    assert "(the right option) after 150 s: late, counted as unanswered" in out
    assert out.index("Q1.") < out.index("Q2.")
