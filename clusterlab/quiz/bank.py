"""The interview question bank: load and validate it, draw numeric questions, grade answers.

The bank is data, one JSON file per topic in clusterlab/data/questions/, checked twice on
load: against the JSON Schema (clusterlab/quiz/schema.json) for shape, then here for what a
schema cannot say (ids unique, links to real notebook sections, expressions that only use
known names, an answer a trial draw can compute).

Three kinds of question:

* ``choice``: one or more correct options, every option with an explanation;
* ``numeric``: parameters drawn at random from stated ranges every time the question is
  shown; the expected answer is computed by a named function of `clusterlab.models` (or of
  `clusterlab.interview_math`), so the quiz and the course share one formula; graded within
  a relative tolerance;
* ``open``: a model answer and a checklist of key points that the learner ticks (self-graded).
"""

from __future__ import annotations

import inspect
import json
import math
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from .expr import Expr, ExpressionError, compile_expr
from .numfmt import AnswerFormatError, fmt, parse_answer, within
from .plural import agree
from .plural import check as agreement_problem
from .validate import schema_errors

PACKAGE_DIR = Path(__file__).resolve().parent.parent
QUESTIONS_DIR = PACKAGE_DIR / "data" / "questions"
SYLLABUS_PATH = PACKAGE_DIR / "data" / "syllabus.json"

TOPICS = (
    "nic_latency_jitter",
    "topology",
    "collectives_costs",
    "algbw_busbw",
    "ddp_buckets_overlap",
    "scaling_tail_latency",
    "stragglers_staleness",
    "races",
    "gradient_scaling",
    "silent_divergence",
    "debugging_hangs",
    "parallelism_traffic",
    "compression",
    "failures_at_scale",
    "cluster_diagnostics",
)
# The topics notebooks 01-08b teach: the default of notebook 09, which comes before sharding,
# compression and failures (10-12) and before reading a real cluster, whose questions (MFU,
# NCCL's log lines) go beyond what the notebooks show.
TOPICS_TO_08B = TOPICS[: TOPICS.index("debugging_hangs") + 1]
LANGS = ("en", "ru")
KINDS = ("choice", "numeric", "open")
PASS_SCORE = 0.75  # an open question counts as known when >= 75% of its key points are ticked

# {name}, {name:spec} (a format spec such as .1f), and in Russian {name|noun}: the number
# followed by a noun that agrees with it ("{N|узел}" gives "64 узла"; see quiz.plural).
_PLACEHOLDER = re.compile(r"\{([A-Za-z][A-Za-z0-9_]*)(?::([^{}|]+))?(?:\|([^{}|]+))?\}")
# {name?shown if name > 0|shown otherwise}: a sentence that states a comparison follows the
# drawn numbers. The branches may hold plain placeholders, not further conditionals.
_BRANCH = r"(?:[^{}|]|\{[A-Za-z][A-Za-z0-9_]*(?::[^{}|]+)?(?:\|[^{}|]+)?\})*"
_CONDITIONAL = re.compile(r"\{([A-Za-z][A-Za-z0-9_]*)\?(" + _BRANCH + r")\|(" + _BRANCH + r")\}")


class BankError(ValueError):
    """The bank on disk is invalid; `problems` lists every problem found."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        shown = "\n  ".join(problems[:30])
        more = f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
        super().__init__(f"invalid question bank ({len(problems)} problems):\n  {shown}{more}")


def load_syllabus(path: Path | str = SYLLABUS_PATH) -> dict[str, dict[str, Any]]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _formula(name: str):
    """The function a numeric question names: in clusterlab.models (collective costs) or
    clusterlab.interview_math (memory, parallelism, failures); None if neither has it."""
    from clusterlab import interview_math, models

    for module in (models, interview_math):
        if callable(func := getattr(module, name, None)):
            return func
    return None


@dataclass(frozen=True)
class Question:
    """One question of the bank, as stored (`raw`), with typed accessors."""

    raw: Mapping[str, Any]

    id = property(lambda self: self.raw["id"])
    topic = property(lambda self: self.raw["topic"])
    difficulty = property(lambda self: self.raw["difficulty"])
    kind = property(lambda self: self.raw["kind"])
    section = property(lambda self: self.raw["section"])
    see_also = property(lambda self: self.raw.get("see_also", []))

    def text(self, lang: str) -> str:
        return self.raw["text"][lang]

    @property
    def multiple(self) -> bool:
        """A choice question with more than one correct option ("choose all that apply")."""
        return sum(o["correct"] for o in self.raw.get("options", [])) > 1

    @cached_property
    def _compiled(self) -> tuple[list[tuple[str, Expr]], dict[str, Expr], Expr]:
        values = [(v["name"], compile_expr(v["expr"])) for v in self.raw.get("values", [])]
        args = {k: compile_expr(v) for k, v in self.raw["args"].items()}
        return values, args, compile_expr(self.raw["answer"])

    def draw_params(self, rng: random.Random) -> dict[str, int | float]:
        """One random draw of the parameters of a numeric question."""
        out: dict[str, int | float] = {}
        for name, spec in self.raw["params"].items():
            if "choices" in spec:
                out[name] = rng.choice(spec["choices"])
                continue
            lo, hi, step = spec["min"], spec["max"], spec["step"]
            count = math.floor((hi - lo) / step + 1e-9) + 1
            value = lo + rng.randrange(count) * step
            integral = all(isinstance(x, int) for x in (lo, step))
            out[name] = int(value) if integral else round(value, 10)
        return out

    def evaluate(self, params: Mapping[str, int | float]) -> dict[str, Any]:
        """All quantities of a numeric question for these parameters: the parameters, the
        derived values, the model's `result` and the expected `answer` (in the question's
        unit)."""
        values, args, answer = self._compiled
        env: dict[str, Any] = dict(params)
        for name, expr in values:
            env[name] = expr(env)
        func = _formula(self.raw["model"])
        env["result"] = func(**{k: e(env) for k, e in args.items()})
        env["answer"] = float(answer(env))
        return env


@dataclass
class Instance:
    """A question as shown once: numeric parameters drawn, choice options in display order."""

    question: Question
    env: dict[str, Any] = field(default_factory=dict)  # numeric: params, values, result, answer
    order: list[int] = field(default_factory=list)  # choice: display position -> option index

    @property
    def id(self) -> str:
        return self.question.id

    @property
    def kind(self) -> str:
        return self.question.kind

    @property
    def answer(self) -> float | None:
        return self.env.get("answer")

    def fill(self, template: str, lang: str) -> str:
        """`template` with {name?yes|no} resolved (yes when the value is > 0), then {name} /
        {name:spec} replaced by this draw's numbers, and {name|noun} by the number and the
        noun agreeing with it as displayed (Russian: "{N|узел}" -> "64 узла")."""
        if not self.env:
            return template

        def choose(m: re.Match[str]) -> str:
            return m.group(2) if self.env[m.group(1)] > 0 else m.group(3)

        def sub(m: re.Match[str]) -> str:
            number = fmt(self.env[m.group(1)], lang, m.group(2))
            return f"{number} {agree(number, m.group(3))}" if m.group(3) else number

        return _PLACEHOLDER.sub(sub, _CONDITIONAL.sub(choose, template))

    def text(self, lang: str) -> str:
        return self.fill(self.question.text(lang), lang)

    def options(self, lang: str) -> list[str]:
        opts = self.question.raw.get("options", [])
        return [opts[i]["text"][lang] for i in self.order]

    def explanation(self, position: int, lang: str) -> str:
        return self.question.raw["options"][self.order[position]]["explanation"][lang]

    def correct_positions(self) -> set[int]:
        opts = self.question.raw.get("options", [])
        return {pos for pos, i in enumerate(self.order) if opts[i]["correct"]}

    def unit(self, lang: str) -> str:
        return self.question.raw.get("unit", {}).get(lang, "")

    def solution(self, lang: str) -> str:
        return self.fill(self.question.raw["solution"][lang], lang)

    def model_answer(self, lang: str) -> str:
        return self.question.raw["model_answer"][lang]

    def answer_more(self, lang: str) -> str | None:
        """The longer answer behind the "More" fold, if the question has one."""
        more = self.question.raw.get("answer_more")
        return more[lang] if more else None

    def answer_60s(self, lang: str) -> list[str]:
        """The answer in 60 seconds (a few bullets), if the question has one."""
        return [item[lang] for item in self.question.raw.get("answer_60s", [])]

    def checklist(self, lang: str) -> list[str]:
        return [item[lang] for item in self.question.raw.get("checklist", [])]


@dataclass(frozen=True)
class Grade:
    """The verdict on one answer. status: correct, partial, wrong, skipped or timeout."""

    status: str
    score: float
    value: float | None = None  # numeric: the learner's number, in the question's unit
    selected: frozenset[int] = frozenset()  # choice: display positions; open: checklist items

    @property
    def correct(self) -> bool:
        return self.score >= PASS_SCORE


UNANSWERED = ("skipped", "timeout")


class Bank:
    """All questions, validated. `Bank.load()` reads the packaged bank."""

    def __init__(self, topic_docs: Mapping[str, Mapping[str, Any]], syllabus: Mapping[str, Any]):
        self.syllabus = syllabus
        self.titles: dict[str, dict[str, str]] = {}
        self.questions: list[Question] = []
        for topic in sorted(topic_docs, key=_topic_order):
            doc = topic_docs[topic]
            self.titles[topic] = dict(doc["title"])
            self.questions.extend(Question(q) for q in doc["questions"])
        self.by_id = {q.id: q for q in self.questions}

    @classmethod
    def load(
        cls,
        directory: Path | str = QUESTIONS_DIR,
        syllabus: Path | str = SYLLABUS_PATH,
        *,
        trial_draws: int = 3,
        schema_engine: str = "auto",
    ) -> Bank:
        """Read every topic file in `directory`, validate it all, raise BankError if invalid.

        schema_engine: which JSON Schema validator to use (see validate.schema_errors)."""
        syllabus_doc = load_syllabus(syllabus)
        docs: dict[str, Any] = {}
        problems: list[str] = []
        files = sorted(Path(directory).glob("*.json"))
        if not files:
            problems.append(f"no topic files in {Path(directory).name}/")
        for path in files:
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                problems.append(f"{path.name}: cannot read: {exc}")
                continue
            errs = schema_errors(doc, engine=schema_engine)
            problems += [f"{path.name}: {e}" for e in errs]
            if errs:
                continue
            if doc["topic"] != path.stem:
                problems.append(f"{path.name}: topic {doc['topic']!r} differs from the file name")
            docs[doc["topic"]] = doc
        if not problems:
            problems += check_semantics(docs, syllabus_doc, trial_draws=trial_draws)
        if problems:
            raise BankError(problems)
        return cls(docs, syllabus_doc)

    # ---- selection ---------------------------------------------------------------------

    def topics(self) -> list[str]:
        return list(self.titles)

    def title(self, topic: str, lang: str) -> str:
        return self.titles[topic][lang]

    def select(
        self,
        topics: Iterable[str] | None = None,
        difficulty: Iterable[int] | None = None,
        kinds: Iterable[str] | None = None,
    ) -> list[Question]:
        """The questions of these topics, difficulties and kinds (None: all), in bank order."""
        t = set(topics) if topics else None
        d = set(difficulty) if difficulty else None
        k = set(kinds) if kinds else None
        if t and (unknown := t - set(self.titles)):
            raise ValueError(f"unknown topics {sorted(unknown)}; known: {self.topics()}")
        return [
            q
            for q in self.questions
            if (t is None or q.topic in t)
            and (d is None or q.difficulty in d)
            and (k is None or q.kind in k)
        ]

    def section_title(self, link: Mapping[str, str]) -> str:
        """'02 All-reduce algorithms and topology › Ring all-reduce' for a section link (the
        course itself is in English, so its titles are too)."""
        nb = link["notebook"]
        title = self.syllabus[nb]["title"]
        return f"{nb.split('_', 1)[0]} {title} › {link['section']}"  # "10b" for a split part

    # ---- drawing and grading -------------------------------------------------------------

    def draw(
        self,
        question: Question | str,
        seed: int | random.Random | None = None,
        *,
        shuffle: bool = True,
    ) -> Instance:
        """Prepare one showing of `question`: draw its parameters, order its options."""
        q = self.by_id[question] if isinstance(question, str) else question
        rng = seed if isinstance(seed, random.Random) else random.Random(seed)
        inst = Instance(q)
        if q.kind == "numeric":
            inst.env = q.evaluate(q.draw_params(rng))
        elif q.kind == "choice":
            inst.order = list(range(len(q.raw["options"])))
            if shuffle:
                rng.shuffle(inst.order)
        return inst

    @staticmethod
    def grade(inst: Instance, response: object, *, lang: str | None = None) -> Grade:
        """Grade `response` to `inst`; None or an empty answer is a skip. `lang` is the
        session's language, which decides how an ambiguous "1,000" reads (`parse_answer`).

        choice: an iterable of display positions; numeric: a string (or number) in the
        question's unit, a known unit of the same kind may be appended; open: an iterable of
        the checklist items the learner ticked. Raises AnswerFormatError for unreadable
        numeric answers (the caller asks again; nothing is recorded).
        """
        if response is None:
            return Grade("skipped", 0.0)
        q = inst.question
        if q.kind == "choice":
            chosen = frozenset(int(i) for i in response)  # type: ignore[union-attr]
            if not chosen:
                return Grade("skipped", 0.0)
            if not chosen <= set(range(len(inst.order))):
                raise ValueError(f"option positions out of range: {sorted(chosen)}")
            ok = chosen == inst.correct_positions()
            return Grade("correct" if ok else "wrong", 1.0 if ok else 0.0, selected=chosen)
        if q.kind == "numeric":
            if isinstance(response, int | float) and not isinstance(response, bool):
                value = float(response)
            else:
                text = str(response)
                if not text.strip():
                    return Grade("skipped", 0.0)
                unit = q.raw["unit"]
                value = parse_answer(text, unit["en"], (unit["ru"],), lang=lang)
            ok = within(value, inst.answer, q.raw["tolerance"])  # type: ignore[arg-type]
            return Grade("correct" if ok else "wrong", 1.0 if ok else 0.0, value=value)
        ticked = frozenset(int(i) for i in response)  # type: ignore[union-attr]
        total = len(q.raw["checklist"])
        if not ticked <= set(range(total)):
            raise ValueError(f"checklist items out of range: {sorted(ticked)}")
        score = len(ticked) / total
        status = "correct" if score >= PASS_SCORE else "partial" if score > 0 else "wrong"
        return Grade(status, score, selected=ticked)


def _topic_order(topic: str) -> tuple[int, str]:
    return (TOPICS.index(topic) if topic in TOPICS else len(TOPICS), topic)


def check_semantics(  # noqa: C901 - a flat list of independent checks reads best
    docs: Mapping[str, Mapping[str, Any]],
    syllabus: Mapping[str, Any],
    *,
    trial_draws: int = 3,
) -> list[str]:
    """Problems a JSON Schema cannot see. Empty list: the bank is consistent."""
    problems: list[str] = []
    seen: dict[str, str] = {}

    def link_ok(where: str, link: Mapping[str, str]) -> None:
        nb = syllabus.get(link["notebook"])
        if nb is None:
            problems.append(f"{where}: notebook {link['notebook']!r} is not in the syllabus")
        elif link["section"] not in nb["sections"]:
            problems.append(f"{where}: {link['notebook']} has no section {link['section']!r}")

    for topic, doc in docs.items():
        for q in doc["questions"]:
            where = f"{topic}.json:{q['id']}"
            if q["id"] in seen:
                problems.append(f"{where}: id already used in {seen[q['id']]}.json")
            seen[q["id"]] = topic
            if q["topic"] != topic:
                problems.append(f"{where}: topic {q['topic']!r} in the file of {topic!r}")
            link_ok(where, q["section"])
            for link in q.get("see_also", []):
                link_ok(where + " see_also", link)
            if q["kind"] == "choice":
                flags = [o["correct"] for o in q["options"]]
                if not any(flags):
                    problems.append(f"{where}: no option is correct")
                if all(flags):
                    problems.append(f"{where}: every option is correct")
                for lang in LANGS:
                    texts = [o["text"][lang] for o in q["options"]]
                    if len(set(texts)) != len(texts):
                        problems.append(f"{where}: two options read the same in {lang}")
            elif q["kind"] == "numeric":
                problems += _check_numeric(where, q, trial_draws)
            elif q["kind"] == "open" and len(q["checklist"]) < 3:
                problems.append(f"{where}: an open question needs at least 3 key points")
    return problems


def _check_numeric(where: str, q: Mapping[str, Any], trial_draws: int) -> list[str]:
    problems: list[str] = []
    known = set(q["params"])
    for name, spec in q["params"].items():
        if "min" in spec and spec["min"] > spec["max"]:
            problems.append(f"{where}: parameter {name}: min > max")
    try:
        for v in q.get("values", []):
            expr = compile_expr(v["expr"])
            if missing := expr.names - known:
                problems.append(f"{where}: value {v['name']} uses unknown {sorted(missing)}")
            if v["name"] in known:
                problems.append(f"{where}: value {v['name']} defined twice")
            known.add(v["name"])
        for name, source in q["args"].items():
            if missing := compile_expr(source).names - known:
                problems.append(f"{where}: argument {name} uses unknown {sorted(missing)}")
        if missing := compile_expr(q["answer"]).names - known - {"result"}:
            problems.append(f"{where}: answer uses unknown {sorted(missing)}")
    except ExpressionError as exc:
        return [*problems, f"{where}: {exc}"]
    known |= {"result", "answer"}
    for lang in LANGS:
        for part, template in (("text", q["text"][lang]), ("solution", q["solution"][lang])):
            for m in _CONDITIONAL.finditer(template):
                if m.group(1) not in known:
                    problems.append(f"{where}: {part}.{lang} uses unknown {{{m.group(1)}?}}")
            if re.search(r"\{[A-Za-z][A-Za-z0-9_]*\?", _CONDITIONAL.sub("", template)):
                problems.append(f"{where}: {part}.{lang} has a malformed {{name?yes|no}}")
            for m in _PLACEHOLDER.finditer(template):
                if m.group(3) and lang != "ru":
                    problems.append(f"{where}: {part}.{lang}: {{name|noun}} is for Russian")
                elif m.group(3) and (why := agreement_problem(m.group(3))):
                    problems.append(f"{where}: {part}.{lang}: {why}")
                if m.group(1) not in known:
                    problems.append(f"{where}: {part}.{lang} uses unknown {{{m.group(1)}}}")
                elif m.group(2):
                    try:
                        format(1.5, m.group(2))
                    except ValueError:
                        problems.append(f"{where}: {part}.{lang}: bad format {m.group(2)!r}")
    func = _formula(q["model"])
    if func is None:
        return [*problems, f"{where}: neither clusterlab.models nor interview_math has "
                f"{q['model']}"]
    try:
        inspect.signature(func).bind(**q["args"])
    except TypeError as exc:
        problems.append(f"{where}: arguments do not fit {q['model']}: {exc}")
    if problems:
        return problems
    question = Question(q)
    rng = random.Random(0)
    for _ in range(trial_draws):
        params = question.draw_params(rng)
        try:
            answer = question.evaluate(params)["answer"]
        except (ArithmeticError, ValueError, TypeError, ExpressionError) as exc:
            problems.append(f"{where}: cannot compute the answer for {params}: {exc}")
            break
        if not (math.isfinite(answer) and answer > 0):
            problems.append(f"{where}: answer {answer} for {params} is not a positive number")
            break
    return problems


__all__ = [
    "PASS_SCORE",
    "TOPICS",
    "TOPICS_TO_08B",
    "AnswerFormatError",
    "Bank",
    "BankError",
    "Grade",
    "Instance",
    "Question",
    "UNANSWERED",
]
