"""Shared test helpers: nothing a test starts may outlive it."""

from __future__ import annotations

import importlib
import pkgutil
import tempfile
import time
from pathlib import Path

import psutil
import pytest


def live_children() -> list[psutil.Process]:
    """This process's descendants that are still running (zombies excluded)."""
    return [p for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture
def no_leftovers():
    """Fail the test if a process it started is still alive 3 s after it ended, or if a
    torchrun agent it started left its log directory in the temp dir."""
    before = {p.pid for p in live_children()}
    agent_dirs = set(Path(tempfile.gettempdir()).glob("torchelastic_*"))
    yield
    new_dirs = set(Path(tempfile.gettempdir()).glob("torchelastic_*")) - agent_dirs
    assert not new_dirs, f"torchrun log directories left behind: {sorted(map(str, new_dirs))}"
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        left = [p for p in live_children() if p.pid not in before]
        if not left:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes left behind: {[p.pid for p in left]}")


def pytest_sessionfinish(session, exitstatus):
    """Kernels that nbval or the grader shut down may be killed before their finalizers run;
    what they left carries their pid (clusterlab-<pid>-*), so remove it once they are gone."""
    from clusterlab.cluster import _sweep_orphaned_dirs

    _sweep_orphaned_dirs()


@pytest.fixture
def verdicts(monkeypatch):
    """Every (holds, claim, busy) the lesson modules pass to `conclude`, recorded instead of
    judged against this machine's load, in order; `conclude` returns `holds`."""
    import clusterlab.lessons as lessons

    seen = []

    def record(holds, claim, *, busy=None):
        seen.append((bool(holds), claim, busy))
        return bool(holds)

    for info in pkgutil.iter_modules(lessons.__path__):
        module = importlib.import_module(f"clusterlab.lessons.{info.name}")
        if hasattr(module, "conclude"):
            monkeypatch.setattr(module, "conclude", record)
    return seen


@pytest.fixture
def shown(monkeypatch):
    """The Markdown each facts.show call would display, rendered from the ledger."""
    from clusterlab import facts as _facts

    texts: list[str] = []
    monkeypatch.setattr(_facts, "show", lambda t, **k: texts.append(_facts.render(t, **k)))
    return texts
