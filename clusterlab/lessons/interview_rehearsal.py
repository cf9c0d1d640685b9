"""What notebook 09 (interview rehearsal) shows around its quiz widgets: the bank's table of
topics, printed text behind a fold, a weak open answer with its graded feedback, a fixed mock
transcript for the static view, and each seed question as its 60-second version with the
model answer and the key points folded."""

from __future__ import annotations

import os
import tempfile
import textwrap
from collections import Counter
from pathlib import Path

from IPython.display import Markdown, display

from clusterlab.quiz.i18n import t
from clusterlab.quiz.render import to_text

from . import show

_SCRATCH: list[tempfile.TemporaryDirectory] = []  # kept alive for the kernel's lifetime


def scratch_progress_file() -> Path:
    """A throwaway quiz-progress file in a temporary directory that lasts as long as this
    kernel, so that the notebook never writes to the learner's own history
    (~/.clusterlab/quiz_progress.json)."""
    scratch = tempfile.TemporaryDirectory(prefix=f"clusterlab-{os.getpid()}-quiz-")
    _SCRATCH.append(scratch)
    return Path(scratch.name) / "quiz_progress.json"


def review_mark(topic: str, notebooks: list[str], so_far) -> str:
    """How the table marks a topic outside `so_far`: taught after notebooks 10-12 when one of
    its review notebooks is 10 or later, else not taught as such (its nearest sections)."""
    later = any(n >= "10" for n in notebooks)  # taught in 10-12; else not taught as such
    return "" if topic in so_far else "  (after 10-12)" if later else "  (nearest sections)"


def print_topics(bank, *, so_far) -> None:
    """The bank as a table: per topic its choice, numeric and open questions and the
    notebooks to review (`review_mark` for topics beyond `so_far`), then the total."""
    counts = Counter((q.topic, q.kind) for q in bank.questions)
    print(f"{'topic':45s} {'choice':>6s} {'numeric':>7s} {'open':>4s}  review in")
    for topic in bank.topics():
        row = [counts[topic, kind] for kind in ("choice", "numeric", "open")]
        notebooks = sorted({q.section["notebook"].split("_")[0] for q in bank.select([topic])})
        print(f"{bank.title(topic, 'en'):45s} {row[0]:6d} {row[1]:7d} {row[2]:4d}  "
              f"{', '.join(notebooks)}{review_mark(topic, notebooks, so_far)}")
    print(f"{'total':45s} {len(bank.questions):>20d}")
    if so_far is not None:  # what the widgets start with
        start = sum(1 for q in bank.questions if q.topic in set(so_far))
        print(f"{'of them in the topics of SO_FAR (the start)':45s} {start:>20d}")


def fold_markdown(summary: str, text: str) -> str:
    """Markdown that shows `summary` and keeps `text`, as preformatted text, behind a fold
    the reader clicks open."""
    return show.details(f"{summary} (click to open)", f"```text\n{text}\n```")


def fold(summary: str, text: str) -> None:
    """Display printed text behind a fold the reader clicks open (`fold_markdown`)."""
    display(Markdown(fold_markdown(summary, text)))


# The parts of each seed question's model answer, by the structure an interviewer listens
# for (notebook 09, "How an open answer is judged"): (label, number of paragraphs), in order.
SEED_STRUCTURE = {
    "seed-nic-latency-jitter": (("mechanism", 3), ("breaks", 3), ("fix_notice", 1),
                                ("scale", 1)),
    "seed-gradient-sync": (("mechanism", 1), ("breaks_fix", 4), ("notice", 1)),
}
# The key points each 60-second bullet makes, in order (the bank's checklist numbers).
SEED_BULLET_POINTS = {
    "seed-nic-latency-jitter": ("1", "4", "5", "6–7"),
    "seed-gradient-sync": ("1", "2–4", "5–7", "9–10"),
}
LABELS = {
    "mechanism": {"en": "Mechanism", "ru": "Механизм"},
    "breaks": {"en": "What breaks", "ru": "Что ломается"},
    "breaks_fix": {"en": "What breaks, and the fix", "ru": "Что ломается и как исправить"},
    "fix_notice": {"en": "The fix, and how you notice", "ru": "Как исправить и как заметить"},
    "notice": {"en": "How you notice", "ru": "Как заметить"},
    "scale": {"en": "What changes at scale", "ru": "Что меняется с масштабом"},
    "kp": {"en": "KP", "ru": "п."},
}


def structured_answer(qid: str, *, bank, lang: str) -> list[tuple[str, str]]:
    """A seed question's model answer as blocks under the labels of `SEED_STRUCTURE`, each
    label over its paragraphs; fails if the bank's paragraphs no longer match the map."""
    paragraphs = bank.draw(qid, 0).model_answer(lang).split("\n\n")
    parts = SEED_STRUCTURE[qid]
    assert sum(n for _, n in parts) == len(paragraphs), (qid, lang, len(paragraphs))
    blocks, start = [], 0
    for label, n in parts:
        blocks.append(("h", LABELS[label][lang]))
        blocks += [("p", para) for para in paragraphs[start:start + n]]
        start += n
    return blocks


def seed_parts(qid: str, *, bank, lang: str) -> tuple[str, list[str], str]:
    """A seed question split for the notebook: the question with its 60-second version, each
    bullet tagged with the key points it makes ([KP 4]), the model answer's paragraphs, and
    the key points' checklist."""
    from clusterlab.quiz.render import question_blocks

    inst = bank.draw(qid, 0)
    bullets = inst.answer_60s(lang)
    tags = SEED_BULLET_POINTS[qid]
    assert len(bullets) == len(tags), qid
    blocks = question_blocks(inst, lang, bank)[1:-1] + [("h", t("answer_60s", lang))]
    blocks += [("li", f"• {b} [{LABELS['kp'][lang]} {tag}]") for b, tag in zip(bullets, tags)]
    points = to_text([("li", f"{i + 1}. {p}") for i, p in enumerate(inst.checklist(lang))])
    return to_text(blocks), inst.model_answer(lang).split("\n\n"), points


def seed_question(qid: str, *, bank, lang: str) -> None:
    """A seed question in `lang`: the 60-second version printed, each bullet tagged with its
    key points; folded, the model answer (about two minutes spoken) under the labels of the
    structure an interviewer listens for, and the key points."""
    head, _, points = seed_parts(qid, bank=bank, lang=lang)
    print(head)
    fold(f"{t('model_answer', lang)}: about two minutes spoken, part by part",
         to_text(structured_answer(qid, bank=bank, lang=lang)))
    fold(f"{t('key_points', lang)}: the checklist of the two-minute answer", points)


def show_graded_open_answer(qid: str, answer: str, covered: set[int], *, bank,
                            lang: str) -> None:
    """An open question (draw 0 of `qid`) in `lang`, an `answer` to it, and the feedback it
    gets with the key points `covered` (numbered from 1, as printed) ticked: the self-graded
    score, the key points with + on those covered, and whether that passes (`PASS_SCORE` of
    the key points); the model answer folded."""
    from clusterlab.quiz.bank import PASS_SCORE
    from clusterlab.quiz.render import feedback_blocks, question_blocks
    from clusterlab.quiz.session import Result

    question = bank.draw(qid, 0)
    print(to_text(question_blocks(question, lang, bank)))
    print("\n" + textwrap.fill(f"The answer: \"{answer}\"", 100) + "\n")
    n = len(question.checklist(lang))
    assert all(1 <= k <= n for k in covered), covered
    # the bank counts key points from 0; the reader sees them numbered from 1
    result = Result(question, bank.grade(question, {k - 1 for k in covered}))
    feedback = feedback_blocks(result, lang, bank, model_answer=False)
    print(to_text(feedback[:-1]))  # the review link last, after the verdict
    score = len(covered) / n
    print(f"{score:.0%} of the key points: {'at or above' if score >= PASS_SCORE else 'below'} "
          f"the pass mark of {PASS_SCORE:.0%}, so the question "
          f"{'moves up a box' if score >= PASS_SCORE else 'comes back first'}.")
    print(to_text(feedback[-1:]))
    fold(t("model_answer", lang),
         to_text([("p", para) for para in question.model_answer(lang).split("\n\n")]))


def show_mock_transcript(bank, *, lang: str, topics, seed: int, answer_after: tuple,
                         time_limit: float) -> None:
    """A fixed mock interview for the static view: len(`answer_after`) choice questions drawn
    with `seed` from `topics`, each printed with its options and answered with all its right
    options (* marks them) after the given seconds on a hand-driven clock (an answer after
    `time_limit` counts as a timeout), then the summary (score, score per topic, weak topics,
    sections to review)."""
    from clusterlab.quiz.render import letter, summary_blocks
    from clusterlab.quiz.session import Config, Session

    now = [0.0]  # the hand-driven clock, in seconds
    mock = Session(bank, Config(lang=lang, topics=topics, mode="mock", count=len(answer_after),
                                time_limit=time_limit, seed=seed, kinds=("choice",)),
                   clock=lambda: now[0])
    for seconds in answer_after:
        question = mock.begin()
        now[0] += seconds
        right = sorted(question.correct_positions())
        result = mock.answer(right)  # every right option, as a strong candidate would
        print(f"Q{mock.index}. {question.text(lang).splitlines()[0]}")
        for pos, option in enumerate(question.options(lang)):
            print(f"  {'*' if pos in right else ' '} {letter(pos)}. {option}")
        chosen = " and ".join(letter(pos) for pos in right)
        status = result.grade.status  # a late answer is graded as unanswered, whatever it says
        print(f"    answered {chosen} (the right option{'s' if len(right) > 1 else ''}) "
              f"after {seconds} s: "
              f"{'late, counted as unanswered' if status == 'timeout' else status}")
    print()
    print(to_text(summary_blocks(mock.summary(), lang, bank)))
