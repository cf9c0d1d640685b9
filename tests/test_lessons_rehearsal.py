"""Notebook 09's two static-view helpers (review r10): the weak open answer with its graded
feedback behind a fold, and the fixed mock transcript."""

from __future__ import annotations

import pytest

from clusterlab.lessons import interview_rehearsal as rehearsal
from clusterlab.quiz import TOPICS_TO_08B, Bank


@pytest.fixture(scope="module")
def bank():
    return Bank.load()


def test_graded_open_answer_prints_the_question_and_folds_the_feedback(bank, capsys,
                                                                       monkeypatch):
    shown = []
    monkeypatch.setattr(rehearsal, "display", lambda md: shown.append(md.data))
    rehearsal.show_graded_open_answer("gs-inconsistent-scaling", "too short", {0}, bank=bank,
                                      lang="en")
    printed = capsys.readouterr().out
    assert bank.draw("gs-inconsistent-scaling", 0).text("en").splitlines()[0][:40] in printed
    assert printed.rstrip().endswith('A weak answer: "too short"')
    assert len(shown) == 1 and shown[0].startswith("<details><summary>The model answer")
    assert "Self-graded: 1/" in shown[0]


@pytest.mark.parametrize("lang", ["en", "ru"])
def test_mock_transcript_counts_the_late_answer_as_a_timeout(bank, capsys, lang):
    rehearsal.show_mock_transcript(bank, lang=lang, topics=TOPICS_TO_08B, seed=4,
                                   answer_after=(45, 150), time_limit=120)
    out = capsys.readouterr().out
    # seed 4 draws sd-nan-from-one-rank first: two right options, both chosen and starred
    assert "answered B and D (the right options) after 45 s: correct" in out
    assert "  * B. " in out and "  * D. " in out and "    A. " in out
    assert "(the right option) after 150 s: timeout" in out
    assert out.index("Q1.") < out.index("Q2.")
