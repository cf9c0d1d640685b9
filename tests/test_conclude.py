"""`conclude`: a measured conclusion is asserted on a quiet machine and said to be not shown,
plainly, on a demonstrably busy one."""

from __future__ import annotations

import os

import pytest

from clusterlab.cores import usable_cores
from clusterlab.experiments import common
from clusterlab.experiments.common import beyond_closed_form, conclude, load_per_core


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))


@pytest.fixture
def loaded(monkeypatch):
    cores = usable_cores()
    high = (common.BUSY_LOAD_PER_CORE + 1) * cores
    monkeypatch.setattr(os, "getloadavg", lambda: (high, high, high))


def test_a_conclusion_that_holds_is_true_and_says_so_once(loaded, capsys):
    assert conclude(True, "the ring was faster") is True
    assert capsys.readouterr().out == "Shown on this run: the ring was faster.\n"
    # the busy evidence does not matter when the claim holds; a trailing full stop is not doubled
    assert conclude(True, " the ring was faster. ", busy="a run took 2x its closed form") is True
    assert capsys.readouterr().out == "Shown on this run: the ring was faster.\n"


def test_the_callers_evidence_turns_a_failure_into_one_plain_sentence(quiet, capsys):
    evidence = "the best run took 1.6x its closed form"
    assert conclude(False, "the ring was faster", busy=evidence) is False
    out = capsys.readouterr().out
    assert out.startswith("Not shown on this run: the ring was faster (the best run took 1.6x")
    assert "rerun on a quieter machine)." in out and out.count("\n") == 1


def test_a_high_load_average_is_evidence_when_the_caller_has_none(loaded, capsys):
    assert conclude(False, "the tail grew") is False
    out = capsys.readouterr().out
    assert "Not shown on this run: the tail grew (load average" in out and "per core" in out


def test_on_a_quiet_machine_a_failure_still_fails(quiet, capsys):
    with pytest.raises(AssertionError, match="the tail grew"):
        conclude(False, "the tail grew")
    assert capsys.readouterr().out == ""


def test_without_a_load_average_a_failure_is_asserted(monkeypatch):
    def unavailable():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    with pytest.raises(AssertionError):
        conclude(False, "the tail grew")


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="claim"):
        conclude(True, "  ")
    with pytest.raises(ValueError, match="busy"):
        conclude(False, "the tail grew", busy="")


def test_evidence_from_runs_far_above_their_closed_form():
    assert beyond_closed_form([(0.11, 0.1), (0.12, 0.1)]) is None
    phrase = beyond_closed_form([(0.11, 0.1), (0.2, 0.1)])
    assert "200 ms against 100 ms" in phrase and "110 ms" not in phrase
    assert beyond_closed_form([(0.2, 0.1)], factor=2.5) is None
    with pytest.raises(ValueError):
        beyond_closed_form([(0.2, 0.1)], factor=1.0)


def test_the_load_is_divided_by_the_cores_this_process_may_use(monkeypatch):
    # pinned to one core of a busy machine, a load of 1.5 leaves the notebook's core crowded
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    monkeypatch.setattr(common, "usable_cores", lambda: 1)
    assert load_per_core() == 3.0
    monkeypatch.setattr(common, "usable_cores", lambda: 4)
    assert load_per_core() == 0.75


def test_the_busy_sentence_names_the_usable_cores(monkeypatch, capsys):
    monkeypatch.setattr(os, "getloadavg", lambda: (2.5, 2.5, 2.5))
    monkeypatch.setattr(common, "usable_cores", lambda: 1)
    assert conclude(False, "the tail grew") is False
    assert "load average 2.5 per core on 1 core;" in capsys.readouterr().out
