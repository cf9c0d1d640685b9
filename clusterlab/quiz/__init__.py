"""Interview rehearsal: a bilingual (English/Russian) question bank on multi-node training
networks, with a practice mode, a timed mock interview, spaced repetition, a JupyterLab
widget and a terminal mode.

    from clusterlab.quiz import QuizWidget
    QuizWidget()                      # in a notebook

    python -m clusterlab.quiz --lang ru --mode mock     # in a terminal

The parts, one job each: `bank` (questions: load, validate, draw, grade), `progress`
(spaced repetition in a local JSON file), `session` (the logic of a run), `render` (what is
shown, as text or HTML), `widget` (ipywidgets), `cli` (terminal).
"""

from .bank import TOPICS, TOPICS_TO_08B, Bank, BankError, Grade, Instance, Question
from .progress import Progress
from .session import Config, Result, Session, Summary

__all__ = [
    "TOPICS",
    "TOPICS_TO_08B",
    "Bank",
    "BankError",
    "Config",
    "Grade",
    "Instance",
    "Progress",
    "QuizWidget",
    "Question",
    "Result",
    "Session",
    "Summary",
    "launch",
]


def __getattr__(name: str):
    # The widget needs ipywidgets; import it only when asked for.
    if name in ("QuizWidget", "launch", "static_sample", "seed_question_text"):
        from . import widget

        return getattr(widget, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
