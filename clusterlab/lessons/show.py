"""Printing what a run showed: Markdown sentences and the units they use."""

from __future__ import annotations


def say(text: str) -> None:
    """Show `text` - a sentence computed from the run, never typed-in numbers - as Markdown in
    a notebook, with a plain-text copy for terminals and nbval."""
    from IPython.display import display

    display({"text/markdown": text, "text/plain": text}, raw=True)


def ms(seconds: float) -> str:
    """Seconds as milliseconds with one decimal: 0.0123 -> '12.3 ms'."""
    return f"{seconds * 1e3:.1f} ms"
