"""Terminal mode of the interview rehearsal: `clusterlab quiz ...` / `python -m clusterlab.quiz`.

Questions are printed, answers are read from stdin one line at a time, so a session can be
driven by a pipe (`printf 'A\\n12.5\\n' | python -m clusterlab.quiz --seed 1`). When stdin is
not a terminal the answers are echoed, so the output reads as a transcript.

Answers: option letters (``A``, ``A,C`` or ``AC``; digits 1, 2... work too) for choice
questions; a number for numeric ones (decimal point or comma; an optional unit of the same
kind is converted); for open questions one line of answer (or just Enter after answering
out loud), then the numbers of the key points you covered (``1 3 4``, ``all``, ``none``).
An empty line skips, ``q`` ends the session early. In a mock interview an answer that
arrives after the time limit counts as unanswered (the terminal cannot interrupt a
half-typed line, so the limit is checked when the line arrives).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import TextIO

from .bank import KINDS, LANGS, TOPICS, Bank
from .i18n import t, unit_in
from .numfmt import AnswerFormatError, fmt
from .progress import Progress
from .render import (
    LETTERS,
    feedback_blocks,
    open_reveal_blocks,
    question_blocks,
    summary_blocks,
    to_text,
)
from .session import MOCK_TIME_LIMIT, MODES, Config, Result, Session

QUIT = {"q", "quit", "exit", "й", "выход"}
SKIP = {"", "skip", "s", "-", "пропустить", "пропуск"}
ALL = {"all", "все", "всё"}
NONE = {"none", "0", "ничего", "нет"}
_HOMOGLYPHS = str.maketrans(
    {"А": "A", "В": "B", "С": "C", "Е": "E", "а": "A", "в": "B", "с": "C", "е": "E"}
)


class _Quit(Exception):
    """The learner typed q, or stdin ended."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="clusterlab quiz",
        description="Interview rehearsal in the terminal: multi-node training networks.",
    )
    p.add_argument("--lang", choices=LANGS, default="en", help="en or ru (default: en)")
    p.add_argument(
        "--topics", default="all", help="comma-separated topics or 'all' (see --list-topics)"
    )
    p.add_argument(
        "--difficulty", default="all", help="levels 1-3: '2', '1,2', '2-3' or 'all' (default)"
    )
    p.add_argument("--kinds", default="all", help="comma-separated: choice, numeric, open")
    p.add_argument(
        "--mode",
        choices=MODES,
        default="practice",
        help="practice: feedback after each answer; mock: a timed interview",
    )
    p.add_argument(
        "--count",
        type=int,
        default=None,
        help="number of questions (mock default: 10; practice: all matching)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"per question (mock default: {MOCK_TIME_LIMIT:.0f}; 0 = none)",
    )
    p.add_argument(
        "--progress",
        metavar="PATH",
        default=None,
        help="progress file (default: $CLUSTERLAB_QUIZ_PROGRESS or "
        "~/.clusterlab/quiz_progress.json)",
    )
    p.add_argument("--no-progress", action="store_true", help="do not read or write progress")
    p.add_argument("--seed", type=int, default=None, help="seed for question order and numbers")
    p.add_argument("--list-topics", action="store_true", help="list the topics and exit")
    return p


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_difficulty(value: str) -> frozenset[int] | None:
    """'all' -> None; '2' -> {2}; '1,2' -> {1, 2}; '2-3' -> {2, 3}."""
    value = value.strip().lower()
    if value in ("", "all", "any"):
        return None
    levels: set[int] = set()
    for part in _split(value):
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad difficulty {value!r}") from None
        levels.update(range(a, b + 1))
    if not levels or not levels <= {1, 2, 3}:
        raise argparse.ArgumentTypeError(f"difficulty must be within 1..3, got {value!r}")
    return frozenset(levels)


def parse_letters(text: str, n: int) -> set[int] | None:
    """Option positions from 'A', 'a, c', 'AC', '1 3'; None if unreadable."""
    s = text.strip().translate(_HOMOGLYPHS).upper()
    tokens = [tok for tok in re.split(r"[\s,;]+", s) if tok]
    out: set[int] = set()
    for tok in tokens:
        if tok.isdigit():
            k = int(tok) - 1
            if not 0 <= k < n:
                return None
            out.add(k)
            continue
        for ch in tok:
            k = LETTERS.find(ch)
            if not 0 <= k < n:
                return None
            out.add(k)
    return out or None


def parse_ticks(text: str, n: int) -> set[int] | None:
    """Checklist items from '1 3 4', '1,2', 'all', 'none'; None if unreadable."""
    s = text.strip().lower()
    if s in ALL:
        return set(range(n))
    if s in NONE or s in SKIP:
        return set()
    out: set[int] = set()
    for tok in re.split(r"[\s,;]+", s):
        if not tok:
            continue
        if not tok.isdigit() or not 1 <= int(tok) <= n:
            return None
        out.add(int(tok) - 1)
    return out


class Terminal:
    """Reads answers from `inp`, writes everything to `out`."""

    def __init__(self, inp: TextIO, out: TextIO, echo: bool):
        self.inp, self.out, self.echo = inp, out, echo

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def ask(self, prompt: str) -> str:
        self.out.write(prompt)
        self.out.flush()
        line = self.inp.readline()
        if not line:
            self.say()
            raise _Quit
        line = line.rstrip("\r\n")
        if self.echo:
            self.say(line)
        if line.strip().lower() in QUIT:
            raise _Quit
        return line


def run(session: Session, bank: Bank, term: Terminal) -> None:
    """Ask every question of `session` through `term`, then print the summary."""
    lg = session.lang
    mode_name = t(session.mode, lg)
    term.say(
        f"{t('title', lg)} — "
        + t("cli_session", lg, mode=mode_name.capitalize(), n=session.total, language=lg)
    )
    progress = session.progress
    if progress is not None and progress.recovered is not None:
        term.say(t("progress_recovered", lg, name=progress.recovered.name))
    if session.total == 0:
        term.say(t("no_questions", lg))
        return
    try:
        while (inst := session.begin()) is not None:
            term.say()
            term.say(to_text(question_blocks(inst, lg, bank, session.index, session.total)))
            if session.config.limit is not None:
                term.say(t("cli_time_limit", lg, t=fmt(session.config.limit, lg)))
            result = _ask(session, term)
            if session.immediate_feedback:
                term.say()
                term.say(to_text(feedback_blocks(result, lg, bank, model_answer=False)))
            else:
                status = result.grade.status
                term.say(t(status if status in ("timeout", "skipped") else "recorded", lg))
    except _Quit:
        session.stop()
    term.say()
    term.say(to_text(summary_blocks(session.summary(), lg, bank, details=session.mode == "mock")))


def _late_note(session: Session, term: Terminal) -> None:
    limit = session.config.limit
    if limit is not None and session.expired():
        lg = session.lang
        term.say(t("cli_late", lg, t=fmt(round(session.elapsed(), 1), lg), limit=fmt(limit, lg)))


def _ask(session: Session, term: Terminal) -> Result:
    inst = session.current
    assert inst is not None
    lg = session.lang
    if inst.kind == "choice":
        n = len(inst.order)
        while True:
            line = term.ask(t("cli_choice_prompt", lg))
            if line.strip().lower() in SKIP:
                return session.skip()
            chosen = parse_letters(line, n)
            if chosen is not None:
                _late_note(session, term)
                return session.answer(chosen)
            term.say(t("cli_bad_letters", lg, letters=", ".join(LETTERS[:n])))
    if inst.kind == "numeric":
        unit = inst.unit(lg)
        prompt = (
            t("cli_numeric_prompt", lg, unit=unit_in(unit, lg))
            if unit
            else t("cli_numeric_prompt_nounit", lg)
        )
        while True:
            line = term.ask(prompt)
            if line.strip().lower() in SKIP:
                return session.skip()
            try:
                _late_note(session, term)
                return session.answer(line)
            except AnswerFormatError as exc:
                key = exc.message_key
                term.say(t(key, lg, text=repr(exc.text), unit=unit_in(unit, lg) or "—"))
    # open: answer first (out loud or one line), then the model answer and self-grading
    term.ask(t("cli_open_prompt", lg))
    in_time = session.reveal()
    _late_note(session, term)
    term.say()
    term.say(to_text(open_reveal_blocks(inst, lg)))
    if not in_time:
        return session.answer(set())  # recorded as a timeout
    n = len(inst.checklist(lg))
    while True:
        ticks = parse_ticks(term.ask(t("cli_tick_prompt", lg)), n)
        if ticks is not None:
            return session.answer(ticks)
        term.say(t("cli_bad_ticks", lg, n=n))


def main(
    argv: list[str] | None = None, *, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> int:
    """Entry point of `clusterlab quiz`. Returns 0 when the session ran (even if cut short)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    out = stdout or sys.stdout
    inp = stdin or sys.stdin
    if stdout is None and hasattr(out, "reconfigure"):
        out.reconfigure(errors="replace")  # never die on a terminal that cannot show Cyrillic
    bank = Bank.load(schema_engine="builtin")  # same schema, without jsonschema's import cost
    if args.list_topics:
        for topic in bank.topics():
            n = len(bank.select([topic]))
            print(f"{topic:22s} {n:3d}  {bank.title(topic, args.lang)}", file=out)
        return 0
    topics = None if args.topics.strip().lower() == "all" else tuple(_split(args.topics))
    if topics and (unknown := set(topics) - set(TOPICS)):
        parser.error(f"unknown topics {sorted(unknown)}; known: {', '.join(TOPICS)}")
    kinds = None if args.kinds.strip().lower() == "all" else tuple(_split(args.kinds))
    if kinds and (bad := set(kinds) - set(KINDS)):
        parser.error(f"unknown kinds {sorted(bad)}; known: {', '.join(KINDS)}")
    try:
        difficulty = parse_difficulty(args.difficulty)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if args.count is not None and args.count < 1:
        parser.error("--count must be at least 1")
    limit = args.time_limit
    if limit is not None and limit < 0:
        parser.error("--time-limit must be >= 0")
    config = Config(
        lang=args.lang,
        topics=topics,
        difficulty=difficulty,
        mode=args.mode,
        count=args.count,
        time_limit=limit,
        seed=args.seed,
        kinds=kinds,
    )
    progress = Progress(save=False) if args.no_progress else Progress(args.progress)
    session = Session(bank, config, progress)
    isatty = getattr(inp, "isatty", lambda: False)
    run(session, bank, Terminal(inp, out, echo=not isatty()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
