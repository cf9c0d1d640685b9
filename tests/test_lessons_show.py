"""`clusterlab.lessons.show`: what a notebook prints besides its sentences - the code that ran."""

from __future__ import annotations

import pytest

from clusterlab.lessons import show


def sample(x):
    y = x + 1
    # --- the part a learner reads
    z = y * 2
    w = z - 3
    # --- end
    return w


def test_code_text_names_the_file_and_lines_and_narrows_to_the_markers():
    whole = show.code_text(show.code_text)
    assert whole.startswith("# clusterlab/lessons/show.py, lines ")
    assert "def code_text(" in whole
    part = show.code_text(sample, start="the part", stop="# --- end")
    body = part.splitlines()[1:]
    assert body == ["# --- the part a learner reads", "z = y * 2", "w = z - 3"]
    first, last = map(int, part.split("lines ")[1].split(":")[0].split("-"))
    assert last - first == 2


def test_code_text_refuses_markers_that_are_not_there():
    with pytest.raises(ValueError, match="no line containing 'nowhere'"):
        show.code_text(sample, start="nowhere")
    with pytest.raises(ValueError, match="after 'the part'"):
        show.code_text(sample, start="the part", stop="y = x + 1")


def test_ms_and_say(capsys):
    assert show.ms(0.0123) == "12.3 ms"
    show.say("**12 ms**")  # outside a kernel IPython prints the plain-text copy
    assert "**12 ms**" in capsys.readouterr().out
