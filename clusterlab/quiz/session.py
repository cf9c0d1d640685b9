"""One quiz session, as pure logic: which questions, in which order, timing, scoring.

The widget and the terminal mode are thin shells around `Session`; everything they show is
decided here, so it is tested without any UI.

Modes:

* practice: questions in spaced-repetition order (missed ones first), immediate feedback,
  no time limit unless one is asked for;
* mock: a short interview of `count` questions spread over the chosen topics, a time limit
  per question (an answer after the limit counts as unanswered), feedback held back until
  the end, then the score and the weak topics.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .bank import LANGS, UNANSWERED, Bank, Grade, Instance
from .progress import Progress

MODES = ("practice", "mock")
MOCK_COUNT = 10  # a mock interview's default length
MOCK_TIME_LIMIT = 120.0  # seconds per question in a mock interview, by default
WEAK_BELOW = 0.6  # a topic is weak when less than 60% of its points were scored


@dataclass
class Config:
    """What the learner chose. None means "all" (topics, difficulty) or the mode's default."""

    lang: str = "en"
    topics: tuple[str, ...] | None = None
    difficulty: frozenset[int] | None = None
    mode: str = "practice"
    count: int | None = None
    time_limit: float | None = None
    seed: int | None = None
    kinds: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.lang not in LANGS:
            raise ValueError(f"lang must be one of {LANGS}, got {self.lang!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.count is not None and self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        if self.time_limit is not None and not self.time_limit >= 0:
            raise ValueError(f"time_limit must be >= 0 seconds (0: none), got {self.time_limit}")
        if self.difficulty is not None:
            self.difficulty = frozenset(int(d) for d in self.difficulty)
            if not self.difficulty <= {1, 2, 3}:
                raise ValueError(f"difficulty must be within 1..3, got {sorted(self.difficulty)}")
        if self.topics is not None:
            self.topics = tuple(self.topics)

    @property
    def limit(self) -> float | None:
        """The per-question time limit in effect: None for no limit. time_limit None means
        the mode's default (MOCK_TIME_LIMIT in mock mode, none in practice); 0 means none."""
        if self.time_limit is not None:
            return float(self.time_limit) if self.time_limit > 0 else None
        return MOCK_TIME_LIMIT if self.mode == "mock" else None


@dataclass
class Result:
    """One question's outcome."""

    instance: Instance
    grade: Grade
    elapsed: float | None = None  # seconds from showing the question to the answer
    response: Any = None  # what the learner entered (text, positions), for the review

    @property
    def unanswered(self) -> bool:
        return self.grade.status in UNANSWERED


@dataclass
class Summary:
    mode: str
    lang: str
    asked: int
    planned: int
    score: float
    unanswered: int
    per_topic: dict[str, tuple[float, int]]  # topic -> (score, questions)
    weak_topics: list[str]
    review: list[dict[str, str]]  # sections behind the missed questions, first miss first
    results: list[Result] = field(repr=False, default_factory=list)

    @property
    def percent(self) -> int:
        return round(100 * self.score / self.planned) if self.planned else 0

    def as_dict(self) -> dict[str, Any]:
        """A compact record for the progress file."""
        return {
            "mode": self.mode,
            "lang": self.lang,
            "asked": self.asked,
            "planned": self.planned,
            "score": round(self.score, 3),
            "unanswered": self.unanswered,
            "weak_topics": self.weak_topics,
            "per_topic": {k: [round(s, 3), n] for k, (s, n) in self.per_topic.items()},
        }


class Session:
    """A run of questions. Drive it with `begin()`, then `answer()`, `skip()` or `timeout()`
    until `finished`; then `summary()`. `clock` is injectable so tests control time."""

    def __init__(
        self,
        bank: Bank,
        config: Config | None = None,
        progress: Progress | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.bank = bank
        self.config = config or Config()
        self.progress = progress
        self.clock = clock
        self.rng = random.Random(self.config.seed)
        pool = bank.select(self.config.topics, self.config.difficulty, self.config.kinds)
        ids = [q.id for q in pool]
        if progress is not None:
            ids = progress.order(ids, self.rng)
        else:
            self.rng.shuffle(ids)
        count = self.config.count
        if self.config.mode == "mock":
            ids = _spread_topics(ids, [bank.by_id[i].topic for i in ids])
            count = count or MOCK_COUNT
        ids = ids[:count] if count else ids
        self.items: list[Instance] = [
            bank.draw(qid, random.Random(self.rng.getrandbits(64))) for qid in ids
        ]
        self.results: list[Result] = []
        self._started: float | None = None
        self._revealed: float | None = None
        self._stopped = False
        self._recorded_session = False

    # ---- state ---------------------------------------------------------------------------

    @property
    def lang(self) -> str:
        return self.config.lang

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def index(self) -> int:
        """0-based position of the current question (= number of results so far)."""
        return len(self.results)

    @property
    def total(self) -> int:
        return len(self.items)

    @property
    def finished(self) -> bool:
        return self._stopped or self.index >= self.total

    @property
    def current(self) -> Instance | None:
        return None if self.finished else self.items[self.index]

    @property
    def immediate_feedback(self) -> bool:
        return self.config.mode == "practice"

    def begin(self) -> Instance | None:
        """Show the current question: starts its clock (once). None when finished."""
        if self.finished:
            return None
        if self._started is None:
            self._started = self.clock()
        return self.current

    def elapsed(self) -> float:
        return 0.0 if self._started is None else self.clock() - self._started

    def remaining(self) -> float | None:
        """Seconds left for the current question, or None without a time limit."""
        limit = self.config.limit
        if limit is None or self.finished:
            return None
        return max(0.0, limit - self.elapsed())

    def expired(self) -> bool:
        limit = self.config.limit
        return limit is not None and self._started is not None and self.elapsed() > limit

    # ---- answering -----------------------------------------------------------------------

    def reveal(self) -> bool:
        """Open questions: the learner has answered and asks for the model answer. This ends
        the timed part; returns False if the time was already up."""
        self.begin()
        if self._revealed is None:
            self._revealed = self.clock()
        limit = self.config.limit
        return limit is None or self._revealed - self._started <= limit  # type: ignore[operator]

    def answer(self, response: Any) -> Result:
        """Grade `response` (see Bank.grade), record it, move on. An answer after the time
        limit counts as unanswered. Raises AnswerFormatError for an unreadable number, and
        records nothing then, so the caller can ask again."""
        inst = self._require_current()
        late = self.expired()
        if inst.kind == "open" and self._revealed is not None:
            late = not self.reveal()
        if late:
            return self._finish(Grade("timeout", 0.0), response)
        grade = self.bank.grade(inst, response, lang=self.lang)
        return self._finish(grade, response)

    def skip(self) -> Result:
        self._require_current()
        return self._finish(Grade("skipped", 0.0), None)

    def timeout(self) -> Result:
        """The UI's timer ran out: the question counts as unanswered."""
        self._require_current()
        return self._finish(Grade("timeout", 0.0), None)

    def stop(self) -> None:
        """End early. In a mock interview the questions not reached count as unanswered."""
        self._stopped = True
        self._record_session()

    def _require_current(self) -> Instance:
        inst = self.begin()
        if inst is None:
            raise RuntimeError("the session is finished")
        return inst

    def _finish(self, grade: Grade, response: Any) -> Result:
        inst = self.items[self.index]
        elapsed = None if self._started is None else self.clock() - self._started
        result = Result(inst, grade, elapsed, response)
        self.results.append(result)
        self._started = None
        self._revealed = None
        if self.progress is not None:
            self.progress.record(inst.id, grade.score, mode=self.config.mode)
        if self.finished:
            self._record_session()
        return result

    def _record_session(self) -> None:
        if self.progress is not None and not self._recorded_session and self.results:
            self._recorded_session = True
            self.progress.record_session(self.summary().as_dict())

    # ---- the end ---------------------------------------------------------------------------

    def summary(self) -> Summary:
        """Score, per-topic breakdown and weak topics of what was asked (in a mock interview,
        of everything planned: questions not reached score 0)."""
        results = list(self.results)
        planned = self.total if self.config.mode == "mock" else len(results)
        items = self.items[:planned]
        per_topic: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for i, inst in enumerate(items):
            entry = per_topic[inst.question.topic]
            entry[0] += results[i].grade.score if i < len(results) else 0.0
            entry[1] += 1
        ordered = {t: (s, n) for t, (s, n) in sorted(per_topic.items(), key=_by_bank(self.bank))}
        weak = sorted(
            (t for t, (s, n) in ordered.items() if s / n < WEAK_BELOW),
            key=lambda t: (ordered[t][0] / ordered[t][1], self.bank.topics().index(t)),
        )
        review: list[dict[str, str]] = []
        for i, inst in enumerate(items):
            missed = i >= len(results) or not results[i].grade.correct
            if missed and inst.question.section not in review:
                review.append(inst.question.section)
        unanswered = sum(r.unanswered for r in results) + (planned - len(results))
        return Summary(
            mode=self.config.mode,
            lang=self.config.lang,
            asked=len(results),
            planned=planned,
            score=sum(r.grade.score for r in results),
            unanswered=unanswered,
            per_topic=ordered,
            weak_topics=weak,
            review=review,
            results=results,
        )


def _by_bank(bank: Bank) -> Callable[[tuple[str, Any]], int]:
    order = {t: i for i, t in enumerate(bank.topics())}
    return lambda kv: order.get(kv[0], len(order))


def _spread_topics(ids: list[str], topics: Iterable[str]) -> list[str]:
    """Reorder `ids` round-robin over topics, keeping the order within each topic, so that
    the first k questions of a mock interview cover as many topics as possible."""
    queues: dict[str, list[str]] = defaultdict(list)
    for qid, topic in zip(ids, topics, strict=True):
        queues[topic].append(qid)
    out: list[str] = []
    while any(queues.values()):
        for topic in list(queues):
            if queues[topic]:
                out.append(queues[topic].pop(0))
    return out
