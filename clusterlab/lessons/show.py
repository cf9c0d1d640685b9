"""Printing what a run showed: Markdown sentences, the units they use, and the code that ran."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path


def say(text: str) -> None:
    """Show `text` - a sentence computed from the run, never typed-in numbers - as Markdown in
    a notebook, with a plain-text copy for terminals and nbval."""
    from IPython.display import display

    display({"text/markdown": text, "text/plain": text}, raw=True)


def fold(summary: str, text: str, *, pre: bool = False, markdown: bool = False) -> None:
    """Show computed `text` behind a fold titled `summary` the reader clicks open: detail that
    would bury a cell's one-line result. Each line is a paragraph (`pre`: kept as preformatted
    text, for tables; `markdown`: text that is Markdown already, such as `facts.render`'s
    wrapped prose with its Sources list, kept as it is). Outside a notebook it prints `text`
    as it is."""
    from IPython.core.interactiveshell import InteractiveShell

    text = text.rstrip("\n")
    if not InteractiveShell.initialized():
        print(text)
        return
    body = (f"```text\n{text}\n```" if pre else text if markdown else
            "\n\n".join(line for line in text.splitlines() if line.strip()))
    say(details(summary, body))


def details(summary: str, body: str) -> str:
    """Markdown that shows `summary` and keeps `body` behind a fold the reader clicks open."""
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def ms(seconds: float, *, digits: int = 1) -> str:
    """Seconds as milliseconds with `digits` decimals: 0.0123 -> '12.3 ms' ('12 ms' with
    digits=0)."""
    return f"{seconds * 1e3:.{digits}f} ms"


def code_text(obj, *, start: str | None = None, stop: str | None = None) -> str:
    """The source of `obj` (a function or class of clusterlab) as the learner should read it:
    a first comment naming its file and lines, then the code, dedented. `start` and `stop`
    narrow it to the lines from the first that contains `start` up to, not including, the
    first later line that contains `stop` (to the end when `stop` is None)."""
    lines, first = inspect.getsourcelines(obj)
    lo, hi = 0, len(lines)
    if start is not None:
        found = [i for i, line in enumerate(lines) if start in line]
        if not found:
            raise ValueError(f"{obj.__qualname__} has no line containing {start!r}")
        lo = found[0]
    if stop is not None:
        found = [i for i in range(lo + 1, len(lines)) if stop in lines[i]]
        if not found:
            raise ValueError(f"{obj.__qualname__} has no line containing {stop!r} "
                             f"after {start!r}")
        hi = found[0]
    path = Path(inspect.getsourcefile(obj)).resolve()
    package = Path(__file__).resolve().parents[1]
    where = path.relative_to(package.parent) if path.is_relative_to(package) else path.name
    body = textwrap.dedent("".join(lines[lo:hi])).rstrip()
    return f"# {where}, lines {first + lo}-{first + hi - 1}: {obj.__qualname__}\n{body}\n"


def code(obj, *, start: str | None = None, stop: str | None = None) -> None:
    """Show `code_text(obj, start=..., stop=...)` in a notebook as highlighted Python: the
    code that ran on the ranks, where a learner would otherwise read only its results."""
    from IPython.display import display

    text = code_text(obj, start=start, stop=stop)
    display({"text/markdown": f"```python\n{text}```", "text/plain": text}, raw=True)
