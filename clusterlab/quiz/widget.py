"""The quiz in JupyterLab: an ipywidgets 8 front-end to `Session`.

Everything the buttons do is a plain method (`on_start`, `on_submit`, `on_reveal`,
`on_skip`, `on_next`, `on_stop`, `on_timeout`, `tick`), so the widget can be driven without
a browser, as the tests do. In mock mode a background thread calls `tick()` a few times a
second to update the visible countdown; when time is up it calls `on_timeout()`. The thread
is tied to one question (a new question, an answer or `close()` stops it), and every handler
holds one lock, so the timer and a click never act on the same question twice.

Without a widget front-end (a terminal IPython, nbconvert to text, a static notebook viewer)
the object shows as plain text: what the quiz contains and how to run it in a terminal.
"""

from __future__ import annotations

import html
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .bank import Bank
from .i18n import DIFFICULTY_NAMES, t, unit_in
from .numfmt import AnswerFormatError, fmt
from .progress import Progress
from .render import (
    LETTERS,
    clock,
    feedback_blocks,
    open_reveal_blocks,
    question_blocks,
    summary_blocks,
    to_html,
    to_text,
)
from .session import MOCK_COUNT, MOCK_TIME_LIMIT, Config, Result, Session

DIFFICULTY_CHOICES = {  # dropdown value -> levels (None: any)
    "any": None,
    "1": frozenset({1}),
    "2": frozenset({2}),
    "3": frozenset({3}),
    "1-2": frozenset({1, 2}),
    "2-3": frozenset({2, 3}),
}


def _progress(progress: Progress | str | os.PathLike[str] | bool | None) -> Progress:
    if isinstance(progress, Progress):
        return progress
    if progress is False:
        return Progress(save=False)
    return Progress(None if progress in (None, True) else progress)  # type: ignore[arg-type]


class QuizWidget:
    """Interview rehearsal in a notebook. `display(QuizWidget())` or just leave it last in a cell.

    progress: a path, a Progress, None for the default file (~/.clusterlab/quiz_progress.json
    or $CLUSTERLAB_QUIZ_PROGRESS), or False to keep nothing. timer=False disables the
    background countdown thread (tests call `tick()` themselves); `clock` replaces
    time.monotonic for the per-question time limit; `kinds` restricts the question kinds
    (choice, numeric, open).
    """

    tick_interval = 0.25  # seconds between countdown updates

    def __init__(
        self,
        bank: Bank | None = None,
        *,
        lang: str = "en",
        topics: Iterable[str] | None = None,
        difficulty: str = "any",
        mode: str = "practice",
        count: int = MOCK_COUNT,
        time_limit: int = int(MOCK_TIME_LIMIT),
        progress: Progress | str | os.PathLike[str] | bool | None = None,
        seed: int | None = None,
        kinds: Iterable[str] | None = None,
        timer: bool = True,
        clock: Callable[[], float] = time.monotonic,
        autostart: bool = False,
    ):
        import ipywidgets as w  # imported here: the rest of the quiz works without it

        self.w = w
        self.bank = bank or Bank.load()
        self.progress = _progress(progress)
        self.seed = seed
        self.kinds = tuple(kinds) if kinds else None
        self.clock = clock
        self.use_timer = timer
        self.session: Session | None = None
        self.last_result: Result | None = None
        self.message = ""  # the last feedback or notice, as plain text (for text_summary)
        self._lock = threading.RLock()
        self._timer_stop: threading.Event | None = None
        self._timer_thread: threading.Thread | None = None
        self._question_token = 0
        self._revealed = False
        self._inputs: list[Any] = []
        self._tick_boxes: list[Any] = []

        full = w.Layout(width="100%")
        self.title = w.HTML()
        self.lang = w.ToggleButtons(options=[("English", "en"), ("Русский", "ru")], value=lang)
        self.topics = w.SelectMultiple(
            options=[(self.bank.title(tp, lang), tp) for tp in self.bank.topics()],
            value=tuple(topics or ()),
            rows=min(11, len(self.bank.topics())),
            layout=w.Layout(width="60%"),
        )
        self.difficulty = w.Dropdown(options=list(DIFFICULTY_CHOICES), value=difficulty)
        self.mode = w.ToggleButtons(
            options=[("practice", "practice"), ("mock", "mock")], value=mode
        )
        self.count = w.BoundedIntText(value=count, min=1, max=max(1, len(self.bank.questions)))
        self.time_limit = w.BoundedIntText(value=time_limit, min=0, max=3600)
        self.start_button = w.Button(button_style="primary")
        self.labels = {
            k: w.HTML() for k in ("lang", "topics", "difficulty", "mode", "count", "time_limit")
        }
        self.settings = w.VBox(
            [
                w.HBox([self.labels["lang"], self.lang]),
                w.HBox([self.labels["mode"], self.mode]),
                w.HBox([self.labels["topics"], self.topics]),
                w.HBox([self.labels["difficulty"], self.difficulty]),
                w.HBox([self.labels["count"], self.count]),
                w.HBox([self.labels["time_limit"], self.time_limit]),
                self.start_button,
            ]
        )
        self.question = w.HTML(layout=full)
        self.timer_label = w.HTML()
        self.answer_box = w.VBox(layout=full)
        self.submit_button = w.Button(button_style="success")
        self.reveal_button = w.Button(button_style="info")
        self.skip_button = w.Button()
        self.next_button = w.Button(button_style="primary")
        self.stop_button = w.Button(button_style="warning")
        self.buttons = w.HBox(
            [
                self.submit_button,
                self.reveal_button,
                self.skip_button,
                self.next_button,
                self.stop_button,
            ]
        )
        self.feedback = w.HTML(layout=full)
        self.summary = w.HTML(layout=full)
        self.play = w.VBox(
            [self.timer_label, self.question, self.answer_box, self.buttons, self.feedback]
        )
        self.box = w.VBox([self.title, self.settings, self.play, self.summary], layout=full)

        self.start_button.on_click(self.on_start)
        self.submit_button.on_click(self.on_submit)
        self.reveal_button.on_click(self.on_reveal)
        self.skip_button.on_click(self.on_skip)
        self.next_button.on_click(self.on_next)
        self.stop_button.on_click(self.on_stop)
        self.lang.observe(self.on_lang_change, names="value")
        self.mode.observe(self.on_mode_change, names="value")

        self.play.layout.display = "none"
        self._relabel()
        self.on_mode_change()
        if self.progress.recovered is not None:
            self._notice(t("progress_recovered", lang, name=self.progress.recovered.name))
        if autostart:
            self.on_start()

    # ---- helpers ---------------------------------------------------------------------------

    @property
    def lang_code(self) -> str:
        return self.lang.value

    def _relabel(self) -> None:
        lg = self.lang_code
        self.title.value = f"<h3 style='margin:0.3em 0'>{html.escape(t('title', lg))}</h3>"
        for key, label in self.labels.items():
            text = t("language" if key == "lang" else key, lg)
            if key == "topics":
                text += f" <span style='color:#666'>({t('all_topics', lg)}: ∅)</span>"
            if key == "time_limit":
                text += " <span style='color:#666'>(0 = ∞)</span>"
            label.value = f"<div style='width:12em'>{text}</div>"
        # Setting `options` resets a selection widget's value: keep what the learner chose.
        topics, mode, difficulty = self.topics.value, self.mode.value, self.difficulty.value
        self.topics.options = [(self.bank.title(tp, lg), tp) for tp in self.bank.topics()]
        self.topics.value = topics
        self.mode.options = [(t("practice", lg), "practice"), (t("mock", lg), "mock")]
        self.mode.value = mode
        names = {"any": t("any_difficulty", lg)}
        for key, levels in DIFFICULTY_CHOICES.items():
            if levels is not None:
                names[key] = " + ".join(DIFFICULTY_NAMES[d][lg] for d in sorted(levels))
        self.difficulty.options = [(names[k], k) for k in DIFFICULTY_CHOICES]
        self.difficulty.value = difficulty
        for button, key in (
            (self.start_button, "start"),
            (self.submit_button, "submit"),
            (self.reveal_button, "reveal"),
            (self.skip_button, "skip"),
            (self.next_button, "next"),
            (self.stop_button, "finish"),
        ):
            button.description = t(key, lg)
        self.reveal_button.layout.width = "auto"
        self.next_button.layout.width = "auto"

    def _notice(self, text: str) -> None:
        self.message = text
        self.feedback.value = f"<div style='color:#8a6d00'>{html.escape(text)}</div>"

    def _show_buttons(self, *visible: Any) -> None:
        for b in (self.submit_button, self.reveal_button, self.skip_button, self.next_button):
            b.layout.display = "" if b in visible else "none"

    # ---- session control -------------------------------------------------------------------

    def config(self) -> Config:
        """The session configuration the selectors describe."""
        mode = self.mode.value
        limit = float(self.time_limit.value) if mode == "mock" else 0.0
        return Config(
            lang=self.lang_code,
            topics=tuple(self.topics.value) or None,
            difficulty=DIFFICULTY_CHOICES[self.difficulty.value],
            mode=mode,
            count=int(self.count.value),
            time_limit=limit,
            seed=self.seed,
            kinds=self.kinds,
        )

    def on_start(self, _: Any = None) -> None:
        with self._lock:
            self._stop_timer()
            self.session = Session(self.bank, self.config(), self.progress, clock=self.clock)
            self.summary.value = ""
            self.feedback.value = ""
            self.message = ""
            if self.session.total == 0:
                self._notice(t("no_questions", self.lang_code))
                return
            self.settings.layout.display = "none"
            self.play.layout.display = ""
            self._show_question()

    def _show_question(self) -> None:
        s = self.session
        assert s is not None
        inst = s.begin()
        if inst is None:
            self._show_summary()
            return
        self._question_token += 1
        self._revealed = False
        self.last_result = None
        self._render_question()
        self._build_inputs()
        if inst.kind == "open":
            self._show_buttons(self.reveal_button, self.skip_button)
        else:
            self._show_buttons(self.submit_button, self.skip_button)
        self._start_timer()
        self.tick()

    def _render_question(self) -> None:
        s = self.session
        assert s is not None and s.current is not None
        blocks = question_blocks(s.current, self.lang_code, self.bank, s.index, s.total)
        if self._revealed:
            blocks += open_reveal_blocks(s.current, self.lang_code)
        self.question.value = to_html(blocks)

    def _build_inputs(self) -> None:
        w = self.w
        s = self.session
        assert s is not None and s.current is not None
        inst = s.current
        lg = self.lang_code
        self._tick_boxes = []
        if inst.kind == "choice":
            letters = list(LETTERS[: len(inst.order)])
            if inst.question.multiple:
                self._inputs = [
                    w.Checkbox(
                        value=False, description=x, indent=False, layout=w.Layout(width="4em")
                    )
                    for x in letters
                ]
                self.answer_box.children = [w.HBox(self._inputs)]
            else:
                self._inputs = [w.ToggleButtons(options=letters, value=None)]
                self._inputs[0].style.button_width = "3em"
                self.answer_box.children = self._inputs
        elif inst.kind == "numeric":
            text = w.Text(
                placeholder="12.5",
                description=t("your_number", lg),
                style={"description_width": "initial"},
            )
            self._inputs = [text]
            self.answer_box.children = [w.HBox([text, w.Label(inst.unit(lg))])]
        else:
            notes = w.Textarea(
                placeholder=t("notes", lg), layout=w.Layout(width="100%", height="8em")
            )
            self._inputs = [notes]
            self.answer_box.children = [notes]

    def _build_checklist(self) -> None:
        w = self.w
        s = self.session
        assert s is not None and s.current is not None
        lg = self.lang_code
        rows = []
        self._tick_boxes = []
        for i, point in enumerate(s.current.checklist(lg)):
            box = w.Checkbox(value=False, indent=False, layout=w.Layout(width="2em"))
            self._tick_boxes.append(box)
            rows.append(w.HBox([box, w.HTML(f"{i + 1}. {html.escape(point)}")]))
        self.answer_box.children = [w.HTML(f"<b>{html.escape(t('self_grade', lg))}</b>"), *rows]

    # ---- answering (the handlers) -------------------------------------------------------------

    def select_options(self, positions: Iterable[int]) -> None:
        """Tick the options at these display positions (what a click on A, C... does)."""
        chosen = set(positions)
        if len(self._inputs) == 1 and isinstance(self._inputs[0], self.w.ToggleButtons):
            (pos,) = chosen or {None}
            self._inputs[0].value = None if pos is None else LETTERS[pos]
        else:
            for i, box in enumerate(self._inputs):
                box.value = i in chosen

    def set_numeric(self, text: str) -> None:
        self._inputs[0].value = text

    def tick_points(self, indices: Iterable[int]) -> None:
        """Tick these checklist items of a revealed open question."""
        chosen = set(indices)
        for i, box in enumerate(self._tick_boxes):
            box.value = i in chosen

    def _response(self) -> Any:
        s = self.session
        assert s is not None and s.current is not None
        kind = s.current.kind
        if kind == "choice":
            first = self._inputs[0]
            if isinstance(first, self.w.ToggleButtons):
                return set() if first.value is None else {LETTERS.index(first.value)}
            return {i for i, box in enumerate(self._inputs) if box.value}
        if kind == "numeric":
            return self._inputs[0].value
        return {i for i, box in enumerate(self._tick_boxes) if box.value}

    def on_reveal(self, _: Any = None) -> None:
        """Open question: show the model answer and the checklist to tick."""
        with self._lock:
            s = self.session
            if s is None or s.current is None or s.current.kind != "open" or self._revealed:
                return
            in_time = s.reveal()
            self._stop_timer()
            if not in_time:
                self.on_timeout()
                return
            self._revealed = True
            self._render_question()
            self._build_checklist()
            self._show_buttons(self.submit_button)

    def on_submit(self, _: Any = None) -> None:
        with self._lock:
            s = self.session
            if s is None or s.current is None:
                return
            lg = self.lang_code
            if s.current.kind == "open" and not self._revealed:
                self.on_reveal()
                return
            response = self._response()
            if s.current.kind == "choice" and not response:
                self._notice(t("no_choice", lg))
                return
            try:
                result = s.answer(response)
            except AnswerFormatError as exc:
                unit = s.current.unit(lg)
                key = exc.message_key
                self._notice(t(key, lg, text=repr(exc.text), unit=unit_in(unit, lg) or "—"))
                return
            self._after_answer(result)

    def on_skip(self, _: Any = None) -> None:
        with self._lock:
            s = self.session
            if s is None or s.current is None:
                return
            self._after_answer(s.skip())

    def on_timeout(self) -> None:
        """Time is up for the current question: it counts as unanswered."""
        with self._lock:
            s = self.session
            if s is None or s.current is None:
                return
            self._after_answer(s.timeout())

    def _after_answer(self, result: Result) -> None:
        self._stop_timer()
        self.last_result = result
        s = self.session
        assert s is not None
        lg = self.lang_code
        if s.immediate_feedback:
            blocks = feedback_blocks(result, lg, self.bank, model_answer=False)
            self.message = to_text(blocks)
            self.feedback.value = to_html(blocks)
            self.answer_box.children = []
            self.timer_label.value = ""
            self._show_buttons(self.next_button)
            return
        status = result.grade.status
        key = status if status in ("timeout", "skipped") else "recorded"
        self._notice(t(key, lg))
        self._show_question()

    def on_next(self, _: Any = None) -> None:
        with self._lock:
            if self.session is None:
                return
            self.feedback.value = ""
            self._show_question()

    def on_stop(self, _: Any = None) -> None:
        """Finish now: the summary (in a mock interview, questions not reached count as 0)."""
        with self._lock:
            if self.session is None:
                return
            self.session.stop()
            self._show_summary()

    def _show_summary(self) -> None:
        self._stop_timer()
        s = self.session
        assert s is not None
        lg = self.lang_code
        blocks = summary_blocks(s.summary(), lg, self.bank, details=s.mode == "mock")
        self.message = to_text(blocks)
        self.summary.value = to_html(blocks)
        self.play.layout.display = "none"
        self.settings.layout.display = ""
        self.start_button.description = t("start", lg)

    # ---- language and mode ---------------------------------------------------------------

    def on_lang_change(self, change: Any = None) -> None:
        with self._lock:
            self._relabel()
            s = self.session
            if s is None:
                return
            s.config.lang = self.lang_code
            if s.finished:
                if self.summary.value:
                    self._show_summary()
                return
            if self.last_result is not None and s.immediate_feedback:
                blocks = feedback_blocks(
                    self.last_result, self.lang_code, self.bank, model_answer=False
                )
                self.message = to_text(blocks)
                self.feedback.value = to_html(blocks)
                return
            self._render_question()
            if self._revealed:
                self._build_checklist()
            elif s.current is not None and s.current.kind == "numeric":
                typed = self._inputs[0].value if self._inputs else ""
                self._build_inputs()
                self._inputs[0].value = typed

    def on_mode_change(self, change: Any = None) -> None:
        mock = self.mode.value == "mock"
        self.time_limit.disabled = not mock

    # ---- the countdown ---------------------------------------------------------------------

    def tick(self) -> None:
        """Update the countdown; if time is up, count the question as unanswered."""
        with self._lock:
            s = self.session
            if s is None or s.current is None:
                self.timer_label.value = ""
                return
            left = s.remaining()
            if left is None or self._revealed or self.last_result is not None:
                self.timer_label.value = ""
                return
            colour = "#c62828" if left <= 10 else "#333"
            self.timer_label.value = (
                f"<b style='color:{colour};font-size:110%'>⏱ "
                f"{html.escape(t('time_left', self.lang_code, t=clock(left)))}</b>"
            )
            if left <= 0:
                self.on_timeout()

    def _start_timer(self) -> None:
        self._stop_timer()
        s = self.session
        if not self.use_timer or s is None or s.config.limit is None:
            return
        stop = threading.Event()
        token = self._question_token
        self._timer_stop = stop

        def run() -> None:
            while not stop.wait(self.tick_interval):
                with self._lock:
                    if stop.is_set() or token != self._question_token:
                        return
                    try:
                        self.tick()
                    except Exception:  # a closed widget must not kill the kernel's thread
                        return

        self._timer_thread = threading.Thread(target=run, name="quiz-timer", daemon=True)
        self._timer_thread.start()

    def _stop_timer(self) -> threading.Thread | None:
        """Tell the countdown thread to stop. It exits at its next wake-up (it re-checks the
        event and the question token under the lock), so there is nothing to wait for here;
        `close()` joins it."""
        if self._timer_stop is not None:
            self._timer_stop.set()
        thread = self._timer_thread
        self._timer_stop = None
        self._timer_thread = None
        return thread

    @property
    def timer_running(self) -> bool:
        return self._timer_thread is not None and self._timer_thread.is_alive()

    def close(self) -> None:
        """Stop the countdown (and wait for its thread) and close our widgets."""
        with self._lock:
            thread = self._stop_timer()
            self._question_token += 1
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        _close_tree(self.box)

    # ---- display -------------------------------------------------------------------------------

    def text_summary(self) -> str:
        """What a front-end without widgets shows: the quiz, or the current question."""
        lg = self.lang_code
        s = self.session
        head = t("text_fallback", lg, n=len(self.bank.questions), t=len(self.bank.topics()))
        if s is None:
            return head
        if s.finished or s.current is None:
            return head + "\n\n" + (self.message or t("finished", lg))
        body = to_text(question_blocks(s.current, lg, self.bank, s.index, s.total))
        return head + "\n\n" + body + ("\n\n" + self.message if self.message else "")

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        try:
            bundle = dict(self.box._repr_mimebundle_(**kwargs) or {})
        except Exception:  # closed widgets, or no widget machinery at all
            bundle = {}
        bundle["text/plain"] = self.text_summary()
        return bundle

    def __repr__(self) -> str:
        return self.text_summary()


def _close_tree(widget: Any) -> None:
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()


class TextQuiz:
    """What `launch()` returns when ipywidgets is missing: the text summary, and the hint."""

    def __init__(self, bank: Bank, lang: str = "en"):
        self.bank, self.lang = bank, lang

    def __repr__(self) -> str:
        return t("text_fallback", self.lang, n=len(self.bank.questions), t=len(self.bank.topics()))


def launch(bank: Bank | None = None, **kwargs: Any) -> QuizWidget | TextQuiz:
    """A QuizWidget, or a plain-text stand-in if ipywidgets is not installed."""
    bank = bank or Bank.load()
    try:
        return QuizWidget(bank, **kwargs)
    except ImportError:
        return TextQuiz(bank, kwargs.get("lang", "en"))


def static_sample(
    bank: Bank | None = None,
    *,
    seed: int = 9,
    lang: str = "en",
    kinds: Iterable[str] = ("numeric", "choice"),
    topics: Iterable[str] | None = None,
) -> str:
    """A deterministic text sample (one question per kind, with its feedback for the correct
    answer; for an open question, every key point ticked), for notebooks that must give the
    same output every run. `topics` restricts the questions drawn (None: all)."""
    import random

    bank = bank or Bank.load()
    rng = random.Random(seed)
    out = []
    for kind in kinds:
        pool = bank.select(topics, kinds=[kind])
        inst = bank.draw(rng.choice(pool), rng)
        out.append(to_text(question_blocks(inst, lang, bank)))
        if kind == "numeric":
            response: Any = fmt(inst.answer, lang)
        elif kind == "choice":
            response = inst.correct_positions()
        else:
            response = set(range(len(inst.checklist(lang))))
        result = Result(inst, bank.grade(inst, response, lang=lang))
        # An open answer's longer version stays folded here, as in the widget.
        blocks = [b for b in feedback_blocks(result, lang, bank) if b[0] != "more"]
        out.append(to_text(blocks))
    return "\n\n".join(out)


def seed_question_text(qid: str, lang: str, bank: Bank | None = None, *, full: bool = True) -> str:
    """An open question with its model answer and key points, as plain text; with
    `full=False`, only its 60-second version and key points."""
    bank = bank or Bank.load()
    inst = bank.draw(qid, 0)
    blocks = question_blocks(inst, lang, bank)[1:-1]
    if full:
        blocks += open_reveal_blocks(inst, lang)
    else:
        if bullets := inst.answer_60s(lang):
            blocks.append(("h", t("answer_60s", lang)))
            blocks += [("li", f"• {b}") for b in bullets]
        blocks.append(("h", t("key_points", lang)))
        blocks += [("li", f"{i + 1}. {p}") for i, p in enumerate(inst.checklist(lang))]
    return to_text(blocks)


__all__ = ["QuizWidget", "TextQuiz", "launch", "seed_question_text", "static_sample"]
