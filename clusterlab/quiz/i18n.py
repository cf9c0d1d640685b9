"""Interface strings of the quiz in English and Russian (the questions carry their own).

A Russian string writes {name|noun} for a count followed by a noun that agrees with it
("{n|вопрос}" gives "112 вопросов", "122 вопроса"; see quiz.plural).
"""

from __future__ import annotations

import re

from .plural import agree

STRINGS: dict[str, dict[str, str]] = {
    "title": {"en": "Interview rehearsal", "ru": "Репетиция собеседования"},
    "language": {"en": "Language", "ru": "Язык"},
    "topics": {"en": "Topics", "ru": "Темы"},
    "all_topics": {"en": "all topics", "ru": "все темы"},
    "difficulty": {"en": "Difficulty", "ru": "Уровень"},
    "any_difficulty": {"en": "any", "ru": "любой"},
    "mode": {"en": "Mode", "ru": "Режим"},
    "practice": {"en": "practice", "ru": "тренировка"},
    "mock": {"en": "mock interview", "ru": "пробное собеседование"},
    "count": {"en": "Questions", "ru": "Вопросов"},
    "time_limit": {"en": "Seconds per question", "ru": "Секунд на вопрос"},
    "start": {"en": "Start", "ru": "Начать"},
    "submit": {"en": "Answer", "ru": "Ответить"},
    "skip": {"en": "Skip", "ru": "Пропустить"},
    "next": {"en": "Next question", "ru": "Следующий вопрос"},
    "finish": {"en": "Finish", "ru": "Завершить"},
    "reveal": {"en": "Show the model answer", "ru": "Показать эталонный ответ"},
    "self_grade": {
        "en": "Tick the key points your answer covered, then press Answer.",
        "ru": "Отметьте ключевые пункты, которые были в вашем ответе, и нажмите «Ответить».",
    },
    "notes": {"en": "Your answer (notes, not graded)", "ru": "Ваш ответ (заметки, не оценивается)"},
    "your_number": {"en": "Your answer", "ru": "Ваш ответ"},
    "question_n": {"en": "Question {i} of {n}", "ru": "Вопрос {i} из {n}"},
    "question_i": {"en": "Question {i}", "ru": "Вопрос {i}"},
    "difficulty_label": {"en": "difficulty", "ru": "уровень"},
    "choose_one": {"en": "Choose one answer.", "ru": "Выберите один ответ."},
    "choose_all": {"en": "Choose all correct answers.", "ru": "Выберите все верные ответы."},
    "numeric_hint": {
        "en": "Type a number in {unit}; answers within ±{tol}% of the right value (relative) "
        "count.",
        "ru": "Введите число в {unit}; засчитывается относительное отклонение от верного ответа "
        "до ±{tol}%.",
    },
    "numeric_hint_nounit": {
        "en": "Type a number; answers within ±{tol}% of the right value (relative) count.",
        "ru": "Введите число; засчитывается относительное отклонение от верного ответа до ±{tol}%.",
    },
    "open_hint": {
        "en": "Answer out loud or in writing, as in an interview, then compare with the model "
        "answer.",
        "ru": "Ответьте вслух или письменно, как на собеседовании, а потом сравните с эталонным "
        "ответом.",
    },
    "time_left": {"en": "Time left: {t}", "ru": "Осталось: {t}"},
    "time_up": {"en": "Time is up.", "ru": "Время вышло."},
    "correct": {"en": "Correct.", "ru": "Верно."},
    "partial": {"en": "Partly covered.", "ru": "Частично."},
    "self_graded": {"en": "Self-graded: {k}/{n}.", "ru": "Самооценка: {k}/{n}."},
    "wrong": {"en": "Not quite.", "ru": "Неверно."},
    "skipped": {"en": "Skipped.", "ru": "Пропущено."},
    "timeout": {
        "en": "Time ran out: counted as unanswered.",
        "ru": "Время вышло: вопрос не засчитан.",
    },
    "recorded": {"en": "Answer recorded.", "ru": "Ответ записан."},
    "you_chose": {"en": "your choice", "ru": "ваш выбор"},
    "right_option": {"en": "correct", "ru": "верно"},
    "wrong_option": {"en": "incorrect", "ru": "неверно"},
    "expected": {"en": "Expected: {value} {unit}", "ru": "Ожидалось: {value} {unit}"},
    "you_gave": {"en": "You answered: {value} {unit}", "ru": "Ваш ответ: {value} {unit}"},
    "tolerance": {
        "en": "(answers within ±{tol}% of it, relative, are accepted)",
        "ru": "(засчитываются ответы с относительным отклонением до ±{tol}% от него)",
    },
    "solution": {"en": "Worked solution", "ru": "Решение"},
    "answer_60s": {"en": "In 60 seconds", "ru": "За 60 секунд"},
    "model_answer": {"en": "Model answer", "ru": "Эталонный ответ"},
    "key_points": {"en": "Key points", "ru": "Ключевые пункты"},
    "more": {"en": "More", "ru": "Подробнее"},
    "covered": {"en": "You covered {k} of {n} key points.", "ru": "Вы назвали {k} из {n|пункта}."},
    "review": {"en": "Review: {link}", "ru": "Повторить: {link}"},
    # A section of the course, whose titles are English: in Russian marked as titles.
    "section_link": {
        "en": "{nb} {title} › {section}",
        "ru": "ноутбук {nb} «{title}», раздел «{section}»",
    },
    "not_a_number": {
        "en": "Could not read a number from {text}. Try again, e.g. 12.5 or 12,5.",
        "ru": "Не получилось прочитать число из {text}. Попробуйте ещё раз, например 12,5.",
    },
    "ambiguous_comma": {
        "en": "{text} can be read two ways (a thousands comma or a decimal comma): write it "
              "without the comma, or with a decimal point.",
        "ru": "{text} можно прочитать двояко (разделитель тысяч или десятичная запятая): напишите "
              "число без запятой или с десятичной точкой.",
    },
    "bad_unit": {
        "en": "The unit in {text} does not fit: answer in {unit} (or a number alone).",
        "ru": "Единица в {text} не подходит: ответьте в {unit} или просто числом.",
    },
    "no_choice": {"en": "Choose at least one option.", "ru": "Выберите хотя бы один вариант."},
    "summary": {"en": "Result", "ru": "Итог"},
    "score": {
        "en": "Score: {score} of {total} ({pct}%)",
        "ru": "Результат: {score} из {total} ({pct}%)",
    },
    "unanswered_n": {"en": "Unanswered: {n}", "ru": "Без ответа: {n}"},
    "by_topic": {"en": "By topic", "ru": "По темам"},
    "weak_topics": {"en": "Weak topics: {topics}", "ru": "Слабые темы: {topics}"},
    "no_weak_topics": {"en": "No weak topics this time.", "ru": "Слабых тем на этот раз нет."},
    "to_review": {"en": "Sections to review", "ru": "Что повторить"},
    "no_questions": {
        "en": "No questions match these topics and difficulty.",
        "ru": "Нет вопросов с такими темами и уровнем.",
    },
    "finished": {"en": "Session finished.", "ru": "Сессия завершена."},
    "progress_recovered": {
        "en": "The progress file was damaged; it was kept as {name} and a new one was started.",
        "ru": "Файл прогресса был повреждён; он сохранён как {name}, начат новый.",
    },
    "review_list": {"en": "Review of your answers", "ru": "Разбор ответов"},
    "cli_choice_prompt": {
        "en": "Your answer (letters, e.g. A or A,C; empty line = skip, q = quit): ",
        "ru": "Ваш ответ (буквы, например A или A,C; пустая строка — пропустить, q — выйти): ",
    },
    "cli_numeric_prompt": {
        "en": "Your answer in {unit} (empty line = skip, q = quit): ",
        "ru": "Ваш ответ в {unit} (пустая строка — пропустить, q — выйти): ",
    },
    "cli_numeric_prompt_nounit": {
        "en": "Your answer (empty line = skip, q = quit): ",
        "ru": "Ваш ответ (пустая строка — пропустить, q — выйти): ",
    },
    "cli_open_prompt": {
        "en": "Your answer in one line, or just Enter when you have answered out loud (q = quit): ",
        "ru": "Ваш ответ одной строкой или просто Enter, если ответили вслух (q — выйти): ",
    },
    "cli_tick_prompt": {
        "en": "Numbers of the points you covered (e.g. 1 3 4; all; none): ",
        "ru": "Номера пунктов, которые вы назвали (например 1 3 4; all — все; none — ни одного): ",
    },
    "cli_bad_letters": {
        "en": "Answer with option letters {letters}, e.g. A or A,C.",
        "ru": "Ответьте буквами вариантов {letters}, например A или A,C.",
    },
    "cli_bad_ticks": {
        "en": "Answer with point numbers from 1 to {n}, 'all' or 'none'.",
        "ru": "Укажите номера пунктов от 1 до {n}, 'all' или 'none'.",
    },
    "cli_time_limit": {"en": "Time limit: {t} s.", "ru": "Время на ответ: {t} с."},
    "cli_late": {
        "en": "Answered after {t} s, over the {limit} s limit.",
        "ru": "Ответ через {t} с, лимит был {limit} с.",
    },
    "cli_session": {
        "en": "{mode}: {n} questions, language {language}.",
        "ru": "{mode}: вопросов — {n}, язык — {language}.",
    },
    "text_fallback": {
        "en": "Interview rehearsal quiz: {n} questions in {t} topics. The interactive quiz needs "
        "a Jupyter front-end with ipywidgets (JupyterLab 4); in a terminal run "
        "`python -m clusterlab.quiz`.",
        "ru": "Тренажёр собеседования: {n|вопрос} по {t|теме@datv}. Для интерактивного режима "
        "нужен Jupyter с ipywidgets (JupyterLab 4); в терминале запустите "
        "`python -m clusterlab.quiz --lang ru`.",
    },
}

DIFFICULTY_NAMES = {
    1: {"en": "basic", "ru": "базовый"},
    2: {"en": "intermediate", "ru": "средний"},
    3: {"en": "advanced", "ru": "продвинутый"},
}


# A unit after "in" ("Type a number in {unit}"): Russian puts it in the prepositional case,
# which only word units change; symbols (мс, ГБ/с, %) stay as they are.
_RU_UNIT_IN = {"токенов": "токенах"}


# A word unit after a number agrees with it ("2500 токенов", "2502 токена"): the bank writes
# it as after 5, this is its form after 1.
_RU_UNIT_AFTER_ONE = {"токенов": "токен"}


def unit_in(unit: str, lang: str) -> str:
    """`unit` (as the bank writes it after a number) in the form that follows "in"."""
    return _RU_UNIT_IN.get(unit, unit) if lang == "ru" else unit


def unit_after(number: str, unit: str, lang: str) -> str:
    """`unit` after the displayed `number`: a Russian word unit agrees with it."""
    if lang == "ru" and unit in _RU_UNIT_AFTER_ONE:
        return agree(number, _RU_UNIT_AFTER_ONE[unit])
    return unit


_AGREE = re.compile(r"\{([A-Za-z_]+)\|([^{}|]+)\}")


def t(key: str, lang: str, **kwargs: object) -> str:
    """The interface string `key` in `lang`, formatted with `kwargs`."""
    text = STRINGS[key][lang if lang in STRINGS[key] else "en"]
    text = _AGREE.sub(lambda m: f"{{{m.group(1)}}} {agree(str(kwargs[m.group(1)]), m.group(2))}",
                      text)
    return text.format(**kwargs) if kwargs else text
