"""Importing an experiment (or the labs) is cheap: what is heavy waits for the run that needs
it, so that this process, and every rank it forks, carries only what it uses."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("numba", "torch._dynamo")  # the simulator's compiler; what DDP imports lazily

CODE = f"""
import importlib, pkgutil, sys
import clusterlab.experiments as experiments
for m in pkgutil.iter_modules(experiments.__path__):
    importlib.import_module(f"clusterlab.experiments.{{m.name}}")
import clusterlab.labs
print(sorted(m for m in {HEAVY!r} if m in sys.modules))
"""


@pytest.mark.timeout(120)
def test_importing_every_experiment_and_lab_loads_neither_numba_nor_dynamo():
    # A fresh interpreter: this one has loaded both for other tests.
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         timeout=100, check=True)
    assert out.stdout.strip() == "[]", out.stdout
