"""Labs: exercises the learner writes, and checks that say precisely whether they work.

In a lab notebook:

    from clusterlab.labs import check, hint
    check("ring_allreduce")     # runs that exercise's checks on your `ring_allreduce`
    hint("ring_allreduce")      # the next hint, if you are stuck

Each lab's checks live in one file of this package (see `core.py` for how they are
written); `clusterlab labs build` generates labs/ from solutions/, and `clusterlab grade`
executes submitted notebooks and tabulates their points.
"""

from __future__ import annotations

import importlib

from .core import EXERCISES, LABS, Fail, Lab, LabCheckFailed, NotDone, check, hint, run_checks

# One module per lab, in course order.
LAB_MODULES = ("network", "ring", "ddp", "collapse", "stragglers", "races", "scaling",
               "detective", "pipeline", "compression")

__all__ = ["EXERCISES", "LABS", "Fail", "Lab", "LabCheckFailed", "NotDone", "all_labs",
           "check", "hint", "run_checks"]


def all_labs() -> dict[str, Lab]:
    """Every registered lab, by id (importing the lab modules on first use)."""
    for name in LAB_MODULES:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:  # a lab still being written
            if exc.name != f"{__name__}.{name}":
                raise
    return LABS


all_labs()
