"""A tiny lab for testing the lab machinery itself (not part of the course).

Its notebook imports this file from the folder it sits in; the tests import it too, so the
grader (the test process) and the kernel agree on its checks.
"""

import torch
import torch.distributed as dist

from clusterlab.labs import Fail, Lab

LAB = Lab("99_toy", "A toy lab", follows="00_start_here")
ADD = LAB.exercise("toy_add", needs=("add",), title="Add two numbers",
                   hints=("Use +.", "return a + b"))
RANKS = LAB.exercise("toy_rank_sum", needs=("rank_sum",), title="Sum of ranks")


@ADD.check("adds small integers")
def _small(ctx):
    got = ctx.call(ctx.learner("add"), 2, 3)
    if got != 5:
        raise Fail(f"add(2, 3) returned {got!r}, not 5")
    return "add(2, 3) == 5"


@ADD.check("adds random floats", points=2, hidden=True)
def _floats(ctx):
    a, b = ctx.rng.normal(size=2)
    got = ctx.call(ctx.learner("add"), a, b)
    if abs(got - (a + b)) > 1e-12:
        raise Fail(f"add({a:.3f}, {b:.3f}) returned {got!r}")


def _on_rank(fn):
    return float(fn())


@RANKS.check("the sum of ranks on 3 ranks", points=2)
def _ranks(ctx):
    fn = ctx.learner("rank_sum")
    with ctx.cluster(nodes=3, timeout=5) as cl:
        out = ctx.run(cl, _on_rank, fn)
    if out != [3.0] * 3:
        raise Fail(f"the ranks returned {out}, not 3.0 each")


def reference_rank_sum():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item()
