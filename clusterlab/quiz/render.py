"""What the quiz shows, as a list of blocks, and those blocks as plain text or HTML.

The terminal, the widget and the widget's text fallback all show the same content; only the
markup differs. A block is (kind, text) with kind one of:
``h`` heading, ``p`` paragraph, ``li`` list item, ``ok`` / ``bad`` list item marked right or
wrong, ``note`` a muted remark, ``more`` a folded longer text (its label, a blank line, then
paragraphs separated by blank lines): a collapsed <details> in HTML, a labelled section in text.
"""

from __future__ import annotations

import html
import re
import textwrap

from .bank import PASS_SCORE, Bank, Instance
from .i18n import DIFFICULTY_NAMES, t, unit_after, unit_in
from .numfmt import fmt
from .session import Result, Summary

Block = tuple[str, str]
LETTERS = "ABCDEFGHIJ"


def letter(position: int) -> str:
    return LETTERS[position]


def clock(seconds: float) -> str:
    """m:ss for a countdown."""
    s = max(0, int(seconds + 0.999))
    return f"{s // 60}:{s % 60:02d}"


def link_text(bank: Bank, link: dict[str, str], lang: str = "en") -> str:
    """A notebook section, named by its (English) titles; in Russian marked as titles."""
    nb = link["notebook"]
    return t("section_link", lang, nb=nb.split("_", 1)[0], title=bank.syllabus[nb]["title"],
             section=link["section"])


def answer_blocks(inst: Instance, lang: str) -> list[Block]:
    """An open question's answer in 60 seconds (if it has one), its model answer (spoken
    length), and its longer version folded."""
    blocks: list[Block] = []
    if bullets := inst.answer_60s(lang):
        blocks.append(("h", t("answer_60s", lang)))
        blocks += [("li", f"• {b}") for b in bullets]
    blocks.append(("h", t("model_answer", lang)))
    blocks += [("p", para) for para in inst.model_answer(lang).split("\n\n")]
    more = inst.answer_more(lang)
    if more:
        blocks.append(("more", f"{t('more', lang)}\n\n{more}"))
    return blocks


def question_blocks(
    inst: Instance, lang: str, bank: Bank, index: int | None = None, total: int | None = None
) -> list[Block]:
    q = inst.question
    head = []
    if index is not None:
        head.append(
            t("question_n", lang, i=index + 1, n=total)
            if total
            else t("question_i", lang, i=index + 1)
        )
    head.append(bank.title(q.topic, lang))
    head.append(f"{t('difficulty_label', lang)}: {DIFFICULTY_NAMES[q.difficulty][lang]}")
    blocks: list[Block] = [("h", " · ".join(head))]
    blocks += [("p", para) for para in inst.text(lang).split("\n\n")]
    if q.kind == "choice":
        blocks += [("li", f"{letter(i)}. {text}") for i, text in enumerate(inst.options(lang))]
        blocks.append(("note", t("choose_all" if q.multiple else "choose_one", lang)))
    elif q.kind == "numeric":
        tol = fmt(q.raw["tolerance"] * 100, lang)
        unit = inst.unit(lang)
        key = "numeric_hint" if unit else "numeric_hint_nounit"
        blocks.append(("note", t(key, lang, unit=unit_in(unit, lang), tol=tol)))
    else:
        blocks.append(("note", t("open_hint", lang)))
    return blocks


def feedback_blocks(
    result: Result, lang: str, bank: Bank, *, model_answer: bool = True
) -> list[Block]:
    """What the learner sees after answering: verdict, why, and where to read more.
    `model_answer=False` leaves out an open question's model answer (already on screen)."""
    inst, grade = result.instance, result.grade
    q = inst.question
    heading = t(grade.status, lang)
    if q.kind == "open" and grade.status not in ("skipped", "timeout"):
        # ticked by the learner, not graded by the course
        heading = t("self_graded", lang, k=len(grade.selected), n=len(inst.checklist(lang)))
    blocks: list[Block] = [("h", heading)]
    if q.kind == "choice":
        correct = inst.correct_positions()
        for pos, text in enumerate(inst.options(lang)):
            mark = t("right_option", lang) if pos in correct else t("wrong_option", lang)
            mine = f" ({t('you_chose', lang)})" if pos in grade.selected else ""
            kind = "ok" if pos in correct else "bad"
            blocks.append(
                (kind, f"{letter(pos)}. {text} — {mark}{mine}. {inst.explanation(pos, lang)}")
            )
    elif q.kind == "numeric":
        unit = inst.unit(lang)
        tol = fmt(q.raw["tolerance"] * 100, lang)
        expected = fmt(inst.answer, lang)
        line = (
            f"{t('expected', lang, value=expected, unit=unit_after(expected, unit, lang))} "
            f"{t('tolerance', lang, tol=tol)}"
        )
        if grade.value is not None:
            given = fmt(grade.value, lang)
            mine = t("you_gave", lang, value=given, unit=unit_after(given, unit, lang))
            line = f"{mine.rstrip()}. {line}"
        blocks.append(("p", line.replace("  ", " ")))
        blocks.append(("h", t("solution", lang)))
        blocks += [("p", para) for para in inst.solution(lang).split("\n\n")]
    else:
        if model_answer:
            blocks += answer_blocks(inst, lang)
        blocks.append(("h", t("key_points", lang)))
        ticked = grade.selected
        for i, point in enumerate(inst.checklist(lang)):
            blocks.append(("ok" if i in ticked else "bad", f"{i + 1}. {point}"))
        n = len(inst.checklist(lang))
        if grade.status not in ("skipped", "timeout"):
            blocks.append(("p", t("covered", lang, k=len(ticked), n=n)))
    blocks.append(("note", t("review", lang, link=link_text(bank, q.section, lang))))
    return blocks


def open_reveal_blocks(inst: Instance, lang: str) -> list[Block]:
    """An open question's model answer and numbered key points, before self-grading."""
    blocks = answer_blocks(inst, lang)
    blocks.append(("h", t("key_points", lang)))
    blocks += [("li", f"{i + 1}. {p}") for i, p in enumerate(inst.checklist(lang))]
    return blocks


def summary_blocks(
    summary: Summary, lang: str, bank: Bank, *, details: bool = False
) -> list[Block]:
    """The end of a session: score, topics, weak topics, what to review; with `details`,
    the feedback on every answer (a mock interview holds it back until here)."""
    score = fmt(round(summary.score, 2), lang)
    line = t("score", lang, score=score, total=summary.planned, pct=summary.percent)
    if summary.unanswered:
        line += " · " + t("unanswered_n", lang, n=summary.unanswered)
    blocks: list[Block] = [("h", t("summary", lang)), ("p", line)]
    if summary.per_topic:
        blocks.append(("h", t("by_topic", lang)))
        for topic, (s, n) in summary.per_topic.items():
            kind = "ok" if s / n >= PASS_SCORE else "bad" if topic in summary.weak_topics else "li"
            blocks.append((kind, f"{bank.title(topic, lang)}: {fmt(round(s, 2), lang)} / {n}"))
    if summary.weak_topics:
        names = "; ".join(bank.title(topic, lang) for topic in summary.weak_topics)
        blocks.append(("p", t("weak_topics", lang, topics=names)))
    elif summary.planned:
        blocks.append(("p", t("no_weak_topics", lang)))
    if summary.review:
        blocks.append(("h", t("to_review", lang)))
        blocks += [("li", link_text(bank, link, lang)) for link in summary.review]
    if details and summary.results:
        blocks.append(("h", t("review_list", lang)))
        for i, result in enumerate(summary.results):
            first = result.instance.text(lang).splitlines()[0]
            if len(first) > 90:
                first = first[:89].rstrip() + "…"
            blocks.append(("h", f"{i + 1}. {first}"))
            blocks += feedback_blocks(result, lang, bank)
    return blocks


# ---- output formats ---------------------------------------------------------------------------

_MARKS = {"li": "  ", "ok": "  + ", "bad": "  - ", "note": "  "}


def to_text(blocks: list[Block], width: int = 100) -> str:
    """Plain text for a terminal (or any front-end without widgets)."""
    out: list[str] = []
    previous = ""
    for kind, text in blocks:
        if kind == "more":
            label, _, body = text.partition("\n\n")
            out += ["", f"{label}:"]
            for para in body.split("\n\n"):
                out += [textwrap.fill(line, width, break_on_hyphens=False)
                        for line in para.split("\n")] + [""]
            out.pop()
            previous = "p"
            continue
        if kind == "h":
            out += ["", text, "-" * min(len(text), width)]
            previous = kind
            continue
        if kind == "p" and previous == "p":
            out.append("")
        indent = _MARKS.get(kind, "")
        # under "a. " or "1. " (3 characters), or under a bullet "• " (2)
        marker = 2 if text.startswith("• ") else 3
        hanging = " " * (len(indent) + (marker if kind in ("li", "ok", "bad") else 0))
        for para in text.split("\n"):
            if para.startswith("    "):  # code: keep as is
                out.append(indent + para)
                continue
            # break_on_hyphens=False: never split "all-to-all" or "lock-free" across lines
            wrapped = textwrap.fill(para, width, initial_indent=indent, subsequent_indent=hanging,
                                    break_on_hyphens=False)
            out.append(wrapped or indent)
        previous = kind
    return "\n".join(out).lstrip("\n")


_CODE = re.compile(r"`([^`]+)`")
_STYLE = {
    "h": "margin:0.8em 0 0.3em 0;font-weight:bold",
    "p": "margin:0.3em 0",
    "li": "margin:0.2em 0 0.2em 1.2em",
    "ok": "margin:0.2em 0 0.2em 1.2em;border-left:3px solid #2e7d32;padding-left:0.5em",
    "bad": "margin:0.2em 0 0.2em 1.2em;border-left:3px solid #c62828;padding-left:0.5em",
    "note": "margin:0.3em 0;color:#666;font-size:90%",
}


def inline_html(text: str) -> str:
    """Escape `text`; `code` spans and indented code lines become <code>."""
    lines = []
    for line in text.split("\n"):
        if line.startswith("    "):
            lines.append(f"<code style='white-space:pre'>{html.escape(line[4:])}</code>")
        else:
            lines.append(_CODE.sub(r"<code>\1</code>", html.escape(line)))
    return "<br>".join(lines)


def _block_html(kind: str, text: str) -> str:
    if kind == "more":
        label, _, body = text.partition("\n\n")
        paras = "".join(
            f"<div style='{_STYLE['p']}'>{inline_html(p)}</div>" for p in body.split("\n\n")
        )
        return (
            f"<details style='margin:0.3em 0'><summary style='cursor:pointer'>"
            f"{html.escape(label)}</summary>{paras}</details>"
        )
    return f"<div style='{_STYLE[kind]}'>{inline_html(text)}</div>"


def to_html(blocks: list[Block]) -> str:
    return "".join(_block_html(kind, text) for kind, text in blocks)
